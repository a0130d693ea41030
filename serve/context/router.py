"""FastAPI routes of the sessions API: ``/v1/sessions/{session_id}`` (read) and
``/v1/sessions/{session_id}/summary`` (refresh the rolling summary now).

Sessions are created by chat requests (``metadata.session_id``); these routes let a client or an
operator see what context-mode keeps for a session (mode, message count, the rolling summary, the
entity table) and force a summary refresh through the summariser (the background refresh runs on
a token threshold with a cooldown; this runs it at once, awaited, over every message except the
newest ``summary_keep_recent``, which stay verbatim). A session belongs to one
tenant (from the API key) and one user (the ``user`` query parameter, as in the chat request's
``user`` field, default ``default``). Session ids are per tenant: an id only another tenant uses
answers exactly as a fresh one (404, the same body), and another user's id of the same tenant
answers 404 too.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Annotated

from fastapi import APIRouter, Depends, Path, Query
from pydantic import Field

from recallserve.kernels import NoControl, StrictModel
from recallserve.serve.context._manager import ContextManager
from recallserve.serve.context._types import ModeName, Session, SessionNotFoundError, SummaryState
from recallserve.serve.pii import SESSION_KEY_CHARS, mask_id

__all__ = ["SessionOut", "EntityOut", "SummaryRefreshOut", "build_router"]

# NOTE: NoControl as the chat's ``user`` and ``metadata.session_id`` (which refuse control characters):
# such an id names no session, and is a 400 naming it, not a 404 about the session.
SessionId = Annotated[str, Path(min_length=1, max_length=128, description="Session id (the chat's metadata.session_id)."),
                      NoControl]
UserQuery = Annotated[str, Query(min_length=1, max_length=256, description="End user owning the session (chat `user`)."),
                      NoControl]


class EntityOut(StrictModel):
    """One entry of the entity table (personal values already masked)."""

    kind: str = Field(description="email | iban | card | account | phone | id | amount | date | time | name.")
    value: str = Field(description="Verbatim (or masked) value.")
    snippet: str = Field(description="The sentence around it, masked.")


class SessionOut(StrictModel):
    """What context-mode keeps for a session."""

    id: str = Field(description="Session id.")
    user: str = Field(description="Owning user.")
    created_at: float = Field(description="Epoch seconds.")
    mode: ModeName | None = Field(description="Session default mode (None = the server default).")
    message_count: int = Field(description="Messages stored.")
    summary: SummaryState = Field(description="The rolling summary and when it was last refreshed.")
    entities: list[EntityOut] = Field(description="The entity table kept verbatim beside the summary.")


class SummaryRefreshOut(StrictModel):
    """Result of a forced summary refresh."""

    refreshed: bool = Field(description="False when no message was left to summarise.")
    elapsed_ms: float = Field(description="Time the refresh took.")
    summary: SummaryState = Field(description="The summary now stored.")


def build_router(manager: ContextManager, get_tenant: Callable[..., Awaitable[str]]) -> APIRouter:
    """The ``/v1/sessions`` router over ``manager``; every route depends on ``get_tenant``."""
    import time

    from recallserve.serve.api.errors import APIError

    router = APIRouter(prefix="/v1/sessions", tags=["sessions"])
    tenant_dep = Depends(get_tenant)

    async def _session(tenant: str, user: str, session_id: str) -> Session:
        if manager.pii_for(tenant) != "allow":
            # NOTE: the keys a chat turn stored (serve.api.app: the user and session id masked).
            user, session_id = mask_id(user, SESSION_KEY_CHARS), mask_id(session_id, SESSION_KEY_CHARS)
        try:
            return await manager.store.get(tenant, user, session_id)
        except SessionNotFoundError as exc:
            raise APIError(404, f"session_id: {exc}", type="not_found_error", param="session_id") from None

    @router.get("/{session_id}", response_model=SessionOut, summary="A session's mode, summary and entity table")
    async def get_session(session_id: SessionId, user: UserQuery = "default", tenant: str = tenant_dep) -> SessionOut:
        s = await _session(tenant, user, session_id)
        entities = await manager.store.entities(tenant, s.user, s.id)
        return SessionOut(id=s.id, user=s.user, created_at=s.created_at, mode=s.mode, message_count=s.message_count,
                          summary=s.summary,
                          entities=[EntityOut(kind=e.kind, value=e.value, snippet=e.snippet) for e in entities])

    @router.post("/{session_id}/summary", response_model=SummaryRefreshOut,
                 summary="Fold every unsummarised message into the rolling summary now")
    async def refresh_summary(session_id: SessionId, user: UserQuery = "default",
                              tenant: str = tenant_dep) -> SummaryRefreshOut:
        s = await _session(tenant, user, session_id)
        if manager.is_refreshing(s):
            raise APIError(409, f"session_id: a summary refresh of {s.id!r} is already running; retry later",
                           type="conflict_error", param="session_id")
        start = time.perf_counter()
        try:
            state = await manager.refresh_summary(s, force=True)
        except Exception as exc:  # NOTE: the summariser deployment failed or timed out: the old summary stays.
            raise APIError(503, f"summariser failed: {exc}", type="server_error") from None
        elapsed = (time.perf_counter() - start) * 1e3
        fresh = await manager.store.get(tenant, s.user, s.id)
        return SummaryRefreshOut(refreshed=state is not None, elapsed_ms=round(elapsed, 2), summary=fresh.summary)

    return router
