"""What the ``bench`` commands that talk to a running cluster share: the ``--url`` / ``--key``
arguments, the loopback-only check, the "is it up" probe and the JSON report file."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from recallserve.deployments.cli import UserError

__all__ = ["LOOPBACK", "add_cluster_arguments", "cluster_base", "write_json"]

LOOPBACK = frozenset({"127.0.0.1", "localhost", "::1"})


def add_cluster_arguments(p: argparse.ArgumentParser) -> None:
    """``--url`` (loopback only) and ``--key`` of the running cluster."""
    p.add_argument("--url", default="http://127.0.0.1:8000", help="the running cluster (loopback only)")
    p.add_argument("--key", default="sk-local", help="API key (default: the cpu-local profile's sk-local)")


def cluster_base(url: str) -> str:
    """``url`` without a trailing slash once it is this machine and a cluster answers ``/healthz``.

    Raises:
        UserError: another host, or nothing answering there.
    """
    import httpx

    base = url.rstrip("/")
    parts = urlsplit(base)
    if parts.scheme not in ("http", "https") or parts.hostname not in LOOPBACK:
        raise UserError(f"--url: expected http://127.0.0.1:PORT (this machine only), got {url!r}")
    try:
        httpx.get(f"{base}/healthz", timeout=10.0).raise_for_status()
    except httpx.HTTPError as exc:
        raise UserError(f"--url: no cluster answering at {base} ({exc}); start one with `recallserve up`") from None
    return base


def write_json(out: Path | None, stem: str, data: dict[str, Any]) -> Path:
    """Write ``data`` to ``out`` (default ``bench-results/<stem>-<UTC time>.json``); returns the path."""
    path = out or Path("bench-results") / time.strftime(f"{stem}-%Y%m%dT%H%M%S.json", time.gmtime())
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2) + "\n")
    print(f"wrote {path}")
    return path
