"""Routes of erasure and export: ``DELETE /v1/users/{user}``, ``GET /v1/erasures/{id}``,
``GET /v1/users/{user}/export``, the audit list ``GET /v1/erasures``, and the operator's
``DELETE /v1/tenants/{tenant}`` (an admin key only: ``auth.admin_tenants``; any other key is a 403).

The tenant is the API key's; ``user`` is the chat request's ``user`` (or a memory's ``user``) as
the client sent it: it is looked up by the key the stores keep (:func:`recallserve.serve.pii.user_key`,
masked under the tenant's PII policy). The erasure answers ``202`` at once with its id; the GET
reports ``pending`` until every copy is gone from every store, file and index, then ``done``.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query, Request
from pydantic import Field
from fastapi.responses import JSONResponse, StreamingResponse

from recallserve.kernels import NoControl, StrictModel
from recallserve.memory_shards.records import SHARED_TENANT_NAME
from recallserve.serve.api.auth import RESERVED_TENANT_PREFIX, Authenticator
from recallserve.serve.api.errors import APIError
from recallserve.serve.erasure._service import ErasureService
from recallserve.serve.erasure._store import MAX_LIST, ErasureRow
from recallserve.serve.pii import user_key

__all__ = ["build_router"]

UserPath = Annotated[str, Path(min_length=1, max_length=128, description="End user (the chat request's `user`)."),
                     NoControl]
TenantPath = Annotated[str, Path(min_length=1, max_length=128, description="Tenant to erase (every record of it)."),
                       NoControl]
ErasureId = Annotated[str, Path(min_length=1, max_length=64, description="Erasure id."), NoControl]


class ErasureList(StrictModel):
    """``GET /v1/erasures``: the audit rows, newest first (no user id, no content)."""

    object: str = Field(default="list", description="Always 'list'.")
    data: list[ErasureRow] = Field(description="Erasures and exports.")


def _requester(request: Request) -> str:
    return getattr(request.state, "key_id", "unknown")


def build_router(service: ErasureService, auth: Authenticator,
                 get_tenant: Callable[..., Awaitable[str]] | None = None) -> APIRouter:
    """The erasure and export routes over ``service`` (every route needs an API key)."""
    router = APIRouter(tags=["erasure"])
    tenant_dep = Depends(get_tenant or auth)

    @router.delete("/v1/users/{user}", status_code=202, response_model=ErasureRow,
                   summary="Erase everything held for one end user of the caller's tenant")
    async def erase_user(user: UserPath, request: Request, tenant: str = tenant_dep) -> JSONResponse:
        row = await service.request(tenant, user_key(user, auth.pii_for(tenant)), _requester(request))
        return JSONResponse(row.model_dump(mode="json"), status_code=202,
                            headers={"location": f"/v1/erasures/{row.id}"})

    @router.delete("/v1/tenants/{target}", status_code=202, response_model=ErasureRow,
                   summary="Erase a whole tenant (admin key only)")
    async def erase_tenant(target: TenantPath, request: Request, tenant: str = tenant_dep) -> JSONResponse:
        if not auth.is_admin(tenant):
            raise APIError(403, "authorization: erasing a tenant needs an admin key (auth.admin_tenants)",
                           type="permission_error", param="authorization", code="admin_required")
        if target == SHARED_TENANT_NAME or target.startswith(RESERVED_TENANT_PREFIX):
            raise APIError(400, f"tenant: {target!r} is not a tenant that can be erased", param="tenant")
        row = await service.request(target, None, _requester(request))
        return JSONResponse(row.model_dump(mode="json"), status_code=202,
                            headers={"location": f"/v1/erasures/{row.id}"})

    @router.get("/v1/erasures", response_model=ErasureList, summary="The tenant's erasures and exports (audit)")
    async def list_erasures(limit: Annotated[int, Query(ge=1, le=MAX_LIST, description="Most rows.")] = 50,
                            tenant: str = tenant_dep) -> ErasureList:
        # NOTE: an admin key reads every tenant's rows (the operator's audit).
        return ErasureList(data=await service.erasures.recent(None if auth.is_admin(tenant) else tenant, limit))

    @router.get("/v1/erasures/{erasure_id}", response_model=ErasureRow, summary="Progress of an erasure")
    async def get_erasure(erasure_id: ErasureId, tenant: str = tenant_dep) -> ErasureRow:
        row = await service.erasures.get(None if auth.is_admin(tenant) else tenant, erasure_id)
        if row is None:
            raise APIError(404, f"erasure_id: erasure {erasure_id} not found", type="not_found_error",
                           param="erasure_id")
        return row

    @router.get("/v1/users/{user}/export", summary="Everything held for one end user, as JSON")
    async def export_user(user: UserPath, request: Request, tenant: str = tenant_dep) -> StreamingResponse:
        chunks = service.export(tenant, user_key(user, auth.pii_for(tenant)), _requester(request))
        return StreamingResponse(chunks, media_type="application/json")

    return router
