"""What the ``bench`` commands that talk to a running cluster share: the ``--url`` / ``--key``
arguments, the loopback-only check, the "is it up" probe, and their clients: ``recallserve.client``
instances (the one HTTP client of the tree), with retries off (a bench counts every refusal)."""

from __future__ import annotations

import argparse
import ssl
from urllib.parse import urlsplit

import httpx

from recallserve.client import AsyncRecallServe, RecallServe, RecallServeError, RetryPolicy
from recallserve.deployments.cli import UserError

__all__ = ["LOOPBACK", "add_cluster_arguments", "async_client", "cluster_base", "sync_client"]

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})
DEFAULT_URL = "http://127.0.0.1:8000"


def add_cluster_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup, optional: bool = False) -> None:
    """``--url`` (loopback only) and ``--key`` of the running cluster.

    Args:
        optional: ``--url`` defaults to None (the bench then runs in process) instead of the
            cpu-local profile's ``http://127.0.0.1:8000``.
    """
    if optional:
        p.add_argument("--url", default=None,
                       help="a running cluster (loopback only): time it instead of an in-process app")
    else:
        p.add_argument("--url", default=DEFAULT_URL, help=f"the running cluster (loopback only; default {DEFAULT_URL})")
    p.add_argument("--key", default="sk-local", help="API key (default: the cpu-local profile's sk-local)")


def cluster_base(url: str) -> str:
    """``url`` without a trailing slash once it is this machine and a cluster answers ``/healthz``.

    Raises:
        UserError: another host, or nothing answering there.
    """
    base = url.rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or parts.hostname not in LOOPBACK:
        raise UserError(f"--url: expected http://127.0.0.1:PORT (this machine only), got {url!r}")
    try:
        with RecallServe(base, timeout=10.0, retry=NO_RETRY) as probe:
            probe.health()
    except RecallServeError as exc:
        raise UserError(f"--url: no cluster answering at {base} ({exc}); start one with `recallserve up`") from None
    return base


#: A bench measures each answer as the server gave it, refusals included.
NO_RETRY = RetryPolicy(max_retries=0)


def async_client(base: str, key: str, timeout: float, max_connections: int | None = None,
                 verify: ssl.SSLContext | None = None) -> AsyncRecallServe:
    """An async client of ``base`` (from :func:`cluster_base`) with ``key``, no retries.

    Args:
        max_connections: the pool's bound (None: httpx's default of 100).
        verify: one TLS context shared by many clients (building one costs ~6 ms of CPU).
    """
    limits = httpx.Limits(max_connections=max_connections) if max_connections is not None else None
    return AsyncRecallServe(base, key, timeout=timeout, retry=NO_RETRY, limits=limits,
                            verify=verify if verify is not None else True)


def sync_client(base: str, key: str, timeout: float) -> RecallServe:
    """A blocking client of ``base`` (from :func:`cluster_base`) with ``key``, no retries."""
    return RecallServe(base, key, timeout=timeout, retry=NO_RETRY)
