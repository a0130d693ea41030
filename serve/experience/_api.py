"""HTTP routes of the experience memory: a FastAPI ``APIRouter`` factory (no app, no Ray).

Routes (all scoped to the tenant that ``get_tenant`` returns; another tenant's ids are 404):

* ``POST /v1/experiences``: create a record (verified by code on the way in) -> 201; the body is
  the stored form or the design's v1.2 JSON (``version``, ``segments``, ``human_reviewer``, ISO times);
* ``GET /v1/experiences/review``: the review queue (every trace not verified with high confidence,
  and the audit sample of auto-accepted ones);
* ``GET /v1/experiences/{id}``: one record with its cache state (``?format=v1.2``: the record alone
  in the v1.2 JSON, which ``POST`` takes back);
* ``POST /v1/experiences/search``: active hits, archival hits (topic / error tags), conflicts;
* ``POST /v1/experiences/{id}/label``: correct -> active, wrong -> archival (+ tags, note).

Bad bodies get a 400 in the error envelope whose ``param`` names the field; personal data under
the tenant's ``reject`` PII policy is a 400 naming the field too, as is a record id holding
personal data under ``mask`` or ``reject`` (an id is a key, stored as sent).
"""


# NOTE: no `from __future__ import annotations` here: FastAPI must see the real annotation
# objects of route parameters, and `Tenant` below is local to the factory.
import re
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Body, Depends, HTTPException, Path, Query, status
from pydantic import Discriminator, Tag

from recallserve.serve.api.limits import path_segment_problem
from recallserve.serve.pii import pii_kinds
from recallserve.serve.experience._models import ExperienceView, LabelRequest, SearchRequest, SearchResult
from recallserve.serve.experience._schema import ExperienceRecord
from recallserve.serve.experience._service import ExperienceNotFound, ExperienceService
from recallserve.serve.experience._v12 import ExperienceRecordV12, from_v12, is_v12, to_v12

__all__ = ["build_router"]

# NOTE: tagged by class name, so a validation error's location reads as the JSON path the client
# wrote (serve.api.errors drops capitalised union member names from it).
_Body = Annotated[
    Annotated[ExperienceRecord, Tag("ExperienceRecord")] | Annotated[ExperienceRecordV12, Tag("ExperienceRecordV12")],
    Discriminator(lambda v: "ExperienceRecordV12" if is_v12(v) or isinstance(v, ExperienceRecordV12)
                  else "ExperienceRecord"),
    Body(description="A record in the stored form, or in the design's v1.2 JSON (with `version` and `segments`)."),
]
_ID = Path(min_length=1, max_length=64, pattern=r"^[A-Za-z0-9_.:-]+$", description="Experience id.")
# NOTE: ids a GET of /v1/experiences/{exp_id} can never reach (GET /v1/experiences/review is the
# review queue): a record created with one was stored and acknowledged, then unreadable by its id.
_ROUTE_NAMES = frozenset({"review"})


# NOTE: an id this server generated before its ids were letters only (serve.experience._schema):
# its hex may look like a card number to the masker; a client posting its export back keeps it.
_OLD_GENERATED = re.compile(r"exp_[0-9a-f]{24}")


def _personal_id(exp_id: str) -> list[str]:
    """The kinds of personal data in a client's experience id (none for an id this server made)."""
    return [] if _OLD_GENERATED.fullmatch(exp_id) else pii_kinds(exp_id)


def _not_found(exc: ExperienceNotFound) -> HTTPException:
    """The 404 of an id the tenant does not hold, naming the path parameter (as /v1/turns does).

    NOTE: an HTTPException, not the ingress's APIError, so the router also answers in an app
    without the ingress's error handlers; those read the field's name off the message.
    """
    return HTTPException(status_code=404, detail=f"exp_id: {exc}")


def build_router(
    service: ExperienceService, get_tenant: Callable[..., Awaitable[str]] | Callable[..., str]
) -> APIRouter:
    """Routes under ``/v1/experiences`` bound to ``service``.

    Args:
        service: The experience service.
        get_tenant: A FastAPI dependency returning the caller's tenant (it reads the API key
            and raises 401 itself).

    Example:
        >>> app.include_router(build_router(service, get_tenant))  # doctest: +SKIP
    """
    router = APIRouter(prefix="/v1/experiences", tags=["experiences"])
    Tenant = Annotated[str, Depends(get_tenant)]

    @router.post("", status_code=status.HTTP_201_CREATED, response_model=ExperienceView)
    async def create_experience(record: _Body, tenant: Tenant) -> ExperienceView:
        if record.metadata.id in _ROUTE_NAMES:
            raise HTTPException(status_code=400, detail=f"metadata.id: {record.metadata.id!r} names a route "
                                                        "(GET /v1/experiences/review); choose another id")
        if (problem := path_segment_problem(record.metadata.id)) is not None:
            raise HTTPException(status_code=400, detail=f"metadata.id: {problem}; choose another id")
        if (kinds := _personal_id(record.metadata.id)) and service._pii_for(tenant) != "allow":
            # NOTE: the id is the record's key, stored and echoed as sent (a masked id could not be
            # read back by the id the client holds): one holding personal data is refused, not kept raw.
            raise HTTPException(status_code=400, detail=f"metadata.id: holds personal data ({', '.join(kinds)}); "
                                                        "an id is stored as sent, choose another id")
        return await service.create(tenant, from_v12(record) if isinstance(record, ExperienceRecordV12) else record)

    @router.get("/review", response_model=list[ExperienceView])
    async def review_queue(
        tenant: Tenant, limit: Annotated[int, Query(ge=1, le=500, description="Most records.")] = 50
    ) -> list[ExperienceView]:
        return await service.review_queue(tenant, limit)

    @router.post("/search", response_model=SearchResult)
    async def search_experiences(req: SearchRequest, tenant: Tenant) -> SearchResult:
        return await service.search(tenant, req)

    @router.get("/{exp_id}", response_model=ExperienceView | ExperienceRecordV12)
    async def get_experience(
        exp_id: Annotated[str, _ID], tenant: Tenant,
        format: Annotated[Literal["view", "v1.2"], Query(
            description="view: the record with its cache state; v1.2: the record alone in the design's JSON.")] = "view",
    ) -> ExperienceView | ExperienceRecordV12:
        try:
            view = await service.get(tenant, exp_id)
        except ExperienceNotFound as exc:
            raise _not_found(exc) from None
        return to_v12(view.record) if format == "v1.2" else view

    @router.post("/{exp_id}/label", response_model=ExperienceView)
    async def label_experience(exp_id: Annotated[str, _ID], req: LabelRequest, tenant: Tenant) -> ExperienceView:
        try:
            return await service.label(tenant, exp_id, req)
        except ExperienceNotFound as exc:
            raise _not_found(exc) from None

    return router
