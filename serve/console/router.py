"""Routes of the console: its static files and the two API routes only the console needs.

* ``GET /console`` (and ``/console/``): the page; ``GET /console/{file}``: its script, styles
  and images, from the package folder ``serve/console/static`` (a fixed list read at start-up:
  no path from the request ever reaches the file system);
* ``GET /v1/console/me``: the tenant of the API key (the sign-in check);
* ``GET /v1/console/health``: the Health page's figures, the caller's own (:mod:`recallserve.serve.console._health`).

The page answers with a strict Content-Security-Policy (scripts and styles from this origin
only, no inline code) and ``X-Frame-Options: DENY``.
"""

# NOTE: no `from __future__ import annotations`: FastAPI must see the real annotation objects.
import asyncio
import mimetypes
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Annotated, Any

from fastapi import APIRouter, Depends
from fastapi.responses import Response
from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.memory_shards.records import tenant_key
from recallserve.serve.api.errors import APIError, clip
from recallserve.serve.api.metrics import render_tenant_metrics
from recallserve.serve.console._health import HealthFigures, health_figures

__all__ = ["STATIC_DIR", "ConsoleMe", "build_console_router", "tenant_records"]

STATIC_DIR = Path(__file__).parent / "static"
_HEADERS = {
    "content-security-policy": "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; "
                               "connect-src 'self'; frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    "x-frame-options": "DENY", "x-content-type-options": "nosniff", "referrer-policy": "no-referrer",
    "cache-control": "no-cache",
}
_TYPES = {".js": "text/javascript", ".css": "text/css", ".html": "text/html", ".svg": "image/svg+xml"}


class ConsoleMe(StrictModel):
    """Who the API key is."""

    tenant: str = Field(description="Tenant of the API key (every console page shows only its data).")
    pii: str = Field(description="PII policy of the tenant: mask, reject or allow.")
    scopes: list[str] = Field(description="Tool scopes of the tenant.")
    retention: dict[str, float | None] = Field(
        default_factory=dict, description="Retention limits in days (memories_days, sessions_days, traces_days); "
                                          "missing = kept until deleted or erased.")


def _files() -> dict[str, tuple[bytes, str]]:
    out = {}
    for path in sorted(STATIC_DIR.iterdir()):
        if path.is_file():
            kind = _TYPES.get(path.suffix) or mimetypes.guess_type(path.name)[0] or "application/octet-stream"
            out[path.name] = (path.read_bytes(), kind)
    return out


def tenant_records(stats: Callable[[], Awaitable[list[dict[str, Any]]]]) -> Callable[[str], Awaitable[int]]:
    """A tenant's own memory count (the shared collection left out) from the shards' ``stats``
    (each with ``tenant_records``: records by tenant key), for :func:`build_console_router`.

    NOTE: the Health page showed each tenant the shards' total of every tenant's records, so
    polling it counted another tenant's writes.
    """
    async def count(tenant: str) -> int:
        key = tenant_key(tenant)
        return sum(int(st.get("tenant_records", {}).get(key, 0)) for st in await stats())

    return count


def build_console_router(auth: Any, memory_records: Callable[[str], Awaitable[int]] | None = None) -> APIRouter:
    """The console's router.

    Args:
        auth: the :class:`~recallserve.serve.api.auth.Authenticator` (a FastAPI dependency giving the tenant).
        memory_records: a tenant's memory count (:func:`tenant_records`), for the Health page;
            None = not shown.
    """
    files = _files()
    if "index.html" not in files:
        raise RuntimeError(f"console: {STATIC_DIR}/index.html is missing (package data not installed?)")
    router = APIRouter()
    Tenant = Annotated[str, Depends(auth)]

    def page(name: str) -> Response:
        found = files.get(name)
        if found is None:
            raise APIError(404, f"name: the console has no file {clip(name, 200)!r}", type="not_found_error", param="name")
        body, kind = found
        return Response(body, media_type=kind, headers=_HEADERS)

    @router.get("/console", include_in_schema=False)
    async def console_index() -> Response:
        return page("index.html")

    @router.get("/console/", include_in_schema=False)
    async def console_index_slash() -> Response:
        return page("index.html")

    @router.get("/console/{name}", include_in_schema=False)
    async def console_file(name: str) -> Response:
        return page(name)

    @router.get("/v1/console/me", response_model=ConsoleMe, tags=["console"], summary="The API key's tenant")
    async def me(tenant: Tenant) -> ConsoleMe:
        return ConsoleMe(tenant=tenant, pii=auth.pii_for(tenant), scopes=auth.scopes_for(tenant),
                         retention=auth.retention_for(tenant))

    @router.get("/v1/console/health", response_model=HealthFigures, tags=["console"],
                summary="Request rate, errors, latency, memory count, cache hit and verification pass rates")
    async def health(tenant: Tenant) -> HealthFigures:
        records, error = None, ""
        if memory_records is not None:
            try:
                async with asyncio.timeout(5.0):
                    records = await memory_records(tenant)
            except Exception as exc:  # noqa: BLE001 - a dead shard is a figure on the page, not a failed page
                # NOTE: the kind only: a shard's message may name another tenant's ids or a host.
                error = type(exc).__name__
        text = await asyncio.to_thread(render_tenant_metrics)
        return health_figures(text.decode(), tenant, records, error)

    return router
