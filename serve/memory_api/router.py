"""FastAPI routes of the memory API: ``/v1/memories`` (add, search, get, delete, list by source).

``build_router(service, get_tenant)`` returns an ``APIRouter`` the ingress includes; every route
depends on ``get_tenant`` (the API key -> tenant dependency), so no route runs unauthenticated
and the tenant never comes from the request body or path. A memory outage
(:class:`~recallserve.serve.memory_api.service.MemoryUnavailable`) leaves as a 503 in the JSON error envelope
with a ``Retry-After`` header, from every route of the router.
"""

from __future__ import annotations

import math
from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request, Response
from fastapi.responses import JSONResponse
from fastapi.routing import APIRoute

from recallserve.kernels import NoControl
from recallserve.serve.api.errors import error_body
from recallserve.serve.memory_api.schemas import (
    AddMemoriesRequest,
    AddMemoriesResponse,
    DeleteResponse,
    MemoryList,
    MemoryOut,
    SearchRequest,
    SearchResponse,
)
from recallserve.serve.memory_api.service import MemoryService, MemoryUnavailable, hit_out, record_out

__all__ = ["build_router"]

class _MemoryRoute(APIRoute):
    """A route that answers a memory outage with a 503 and ``Retry-After`` (seconds, rounded up)."""

    def get_route_handler(self) -> Callable[[Request], Awaitable[Response]]:
        handler = super().get_route_handler()

        async def run(request: Request) -> Response:
            try:
                return await handler(request)
            except MemoryUnavailable as exc:
                # NOTE: the app-wide APIError handler would send the same body without the header.
                return JSONResponse(error_body(exc.message, exc.type, exc.param, exc.code), status_code=exc.status,
                                    headers={"Retry-After": str(max(1, math.ceil(exc.retry_after_s)))})

        return run


# NOTE: NoControl as every id (kernels.no_control): a newline or NUL in a path id is a 400 naming it,
# not a lookup whose 404 echoes it into the answer and the log.
MemoryId = Annotated[str, Path(min_length=1, max_length=128, description="Memory id."), NoControl]


def build_router(service: MemoryService, get_tenant: Callable[..., Awaitable[str]]) -> APIRouter:
    """The ``/v1/memories`` router over ``service``.

    Args:
        service: the memory service (in-process or over deployment handles).
        get_tenant: FastAPI dependency returning the caller's tenant (401 on a bad key).

    Example:
        >>> app.include_router(build_router(service, Authenticator({"sk-a": "acme"})))
    """
    router = APIRouter(prefix="/v1/memories", tags=["memories"], route_class=_MemoryRoute)
    # NOTE: a default-value Depends, not an Annotated alias: with postponed annotations FastAPI
    # resolves annotation strings in module globals, where a local alias does not exist.
    tenant_dep = Depends(get_tenant)

    @router.post("", response_model=AddMemoriesResponse, summary="Add a batch of memories (durable on reply)")
    async def add_memories(body: AddMemoriesRequest, tenant: str = tenant_dep) -> AddMemoriesResponse:
        return AddMemoriesResponse(ids=await service.add(tenant, body.memories))

    @router.post("/search", response_model=SearchResponse, summary="Hybrid search of the caller's memories")
    async def search_memories(body: SearchRequest, tenant: str = tenant_dep) -> SearchResponse:
        return SearchResponse(data=[hit_out(h) for h in await service.search_request(tenant, body)])

    @router.get("", response_model=MemoryList, summary="Memories with a source id")
    async def list_memories(
        source_id: Annotated[str, Query(min_length=1, max_length=256, description="Dedup key to look up."), NoControl],
        tenant: str = tenant_dep,
    ) -> MemoryList:
        return MemoryList(data=[record_out(r) for r in await service.list_by_source(tenant, source_id)])

    @router.get("/{memory_id}", response_model=MemoryOut, summary="One memory")
    async def get_memory(memory_id: MemoryId, tenant: str = tenant_dep) -> MemoryOut:
        return record_out(await service.get(tenant, memory_id))

    @router.delete("/{memory_id}", response_model=DeleteResponse, summary="Delete one of the caller's memories")
    async def delete_memory(memory_id: MemoryId, tenant: str = tenant_dep) -> DeleteResponse:
        await service.delete(tenant, memory_id)
        return DeleteResponse(id=memory_id, deleted=True)

    return router
