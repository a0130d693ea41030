"""Refuse to load anything but this machine: load tests are for a local cpu-local cluster."""

from __future__ import annotations

from urllib.parse import urlsplit

__all__ = ["ALLOWED_HOSTS", "HostRefused", "check_host"]

ALLOWED_HOSTS = frozenset({"127.0.0.1", "localhost", "::1"})


class HostRefused(ValueError):
    """The target is not this machine."""


def check_host(url: str) -> str:
    """Return ``url`` normalised (no trailing slash) if it points at this machine.

    Raises:
        HostRefused: any other host, a missing scheme, or a scheme other than http/https.

    Example:
        >>> check_host("http://127.0.0.1:8000/")
        'http://127.0.0.1:8000'
    """
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise HostRefused(f"host: expected http://127.0.0.1:PORT, got {url!r}")
    if parts.hostname not in ALLOWED_HOSTS:
        raise HostRefused(f"host: load tests only target this machine ({', '.join(sorted(ALLOWED_HOSTS))}), got {parts.hostname!r}")
    return url.rstrip("/")
