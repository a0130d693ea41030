"""FastAPI routes of the turn traces (what the console's Turns and Sessions pages read).

* ``GET /v1/turns``: the caller's newest turns (``limit``, ``session_id``, ``before`` for the next page);
* ``GET /v1/turns/{turn_id}``: one turn's whole trace (route, steps, tool calls, memories, the prompt);
* ``GET /v1/turns/sessions``: the caller's sessions with traced turns, each with its last turn's
  context mode and token breakdown (the session's summary and entity table: ``/v1/sessions/{id}``).

Every route is scoped to the API key's tenant; another tenant's turn id answers exactly as an id
nobody holds (404, the same body).
"""

# NOTE: no `from __future__ import annotations`: FastAPI must see the real annotation objects.
from collections.abc import Awaitable, Callable
from typing import Annotated, Literal

from fastapi import APIRouter, Depends, Path, Query
from pydantic import Field

from recallserve.kernels import NoControl, StrictModel
from recallserve.serve.api.errors import APIError
from recallserve.serve.pii import SESSION_KEY_CHARS, mask_id
from recallserve.serve.traces._models import TURN_ID_CHARS, TraceNotFoundError, TraceSession, TraceSummary, TurnTrace
from recallserve.serve.traces._recorder import TraceBackend
from recallserve.serve.traces._store import MAX_LIST

__all__ = ["TurnList", "TraceSessionList", "build_router"]


class TurnList(StrictModel):
    """The newest turns, newest first."""

    object: Literal["list"] = Field(default="list", description="Always 'list'.")
    data: list[TraceSummary] = Field(description="Turns.")


class TraceSessionList(StrictModel):
    """Sessions with traced turns, most recently active first."""

    object: Literal["list"] = Field(default="list", description="Always 'list'.")
    data: list[TraceSession] = Field(description="Sessions.")


def build_router(store: TraceBackend, get_tenant: Callable[..., Awaitable[str]]) -> APIRouter:
    """The ``/v1/turns`` router over ``store``; every route depends on ``get_tenant``."""
    router = APIRouter(prefix="/v1/turns", tags=["turns"])
    Tenant = Annotated[str, Depends(get_tenant)]
    Limit = Annotated[int, Query(ge=1, le=MAX_LIST, description=f"Most rows (1-{MAX_LIST}).")]

    @router.get("", response_model=TurnList, summary="The newest traced chat turns")
    async def list_turns(
        tenant: Tenant, limit: Limit = 50,
        session_id: Annotated[str | None, Query(min_length=1, max_length=128, description="Only this session."),
                              NoControl] = None,
        before: Annotated[float | None, Query(ge=0, le=1e11, allow_inf_nan=False,
                                              description="Only turns before this epoch time (next page).")] = None,
    ) -> TurnList:
        # NOTE: a trace keeps its session id masked to the session store's key (serve.traces._build):
        # look it up so, at the store's length (a long id masked at another length was another key).
        key = mask_id(session_id, SESSION_KEY_CHARS) if session_id is not None else None
        return TurnList(data=await store.recent(tenant, limit, session_id=key, before=before))

    # NOTE: a route name here must be in serve.api.limits.RESERVED_REQUEST_IDS (no turn may be kept under it).
    @router.get("/sessions", response_model=TraceSessionList, summary="Sessions with traced turns")
    async def list_sessions(tenant: Tenant, limit: Limit = 50) -> TraceSessionList:
        return TraceSessionList(data=await store.sessions(tenant, limit))

    @router.get("/{turn_id}", response_model=TurnTrace, summary="One turn's trace")
    async def get_turn(
        tenant: Tenant,
        turn_id: Annotated[str, Path(min_length=1, max_length=TURN_ID_CHARS, pattern=r"^[A-Za-z0-9._:~\[\]-]+$",
                                     description="Turn id: the request id, or the masked key a list shows.")],
    ) -> TurnTrace:
        try:
            # NOTE: looked up as the trace keeps it (serve.traces._build): a request id holding personal
            # data by its masked key; a listed (already masked) key and any other id are unchanged.
            return await store.get(tenant, mask_id(turn_id, TURN_ID_CHARS))
        except TraceNotFoundError as exc:
            raise APIError(404, f"turn_id: {exc}", type="not_found_error", param="turn_id") from None

    return router
