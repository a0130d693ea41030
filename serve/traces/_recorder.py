"""The pipeline's side of the trace store: build a turn's trace and store it off the request path."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from recallserve.serve.engine import ChatMessage
from recallserve.serve.traces._build import build_trace
from recallserve.serve.traces._models import TraceConfig, TraceSession, TraceSummary, TurnTrace
from recallserve.serve.turn import Turn

__all__ = ["TraceBackend", "TraceRecorder"]


class TraceBackend(Protocol):
    """The async methods of :class:`~recallserve.serve.traces.TraceStore` (a ``RemoteStore`` in the cluster)."""

    async def put(self, tenant: str, trace: TurnTrace) -> None: ...

    async def recent(self, tenant: str, limit: int = 50, *, session_id: str | None = None,
                     before: float | None = None) -> list[TraceSummary]: ...

    async def get(self, tenant: str, trace_id: str) -> TurnTrace: ...

    async def sessions(self, tenant: str, limit: int = 50) -> list[TraceSession]: ...


class TraceRecorder:
    """Stores one trace per answered chat turn (when ``config.enabled``).

    Args:
        store: the trace store (local, or the state deployment's through a handle).
        config: sizes and retention (the ``traces`` section of the app config); the store enforces
            the retention, this side the sizes.
    """

    def __init__(self, store: TraceBackend, config: TraceConfig | None = None) -> None:
        self.store = store
        self.config = config or TraceConfig()

    async def record(self, tenant: str, turn: Turn, *, request_id: str, user: str, path: str, stream: bool,
                     answer: str, finish: str, prompt_tokens: int, completion_tokens: int,
                     prompt: Sequence[ChatMessage], agent_meta: dict[str, Any] | None, started: float,
                     experience: dict[str, Any] | None = None) -> None:
        """Build the turn's trace (:func:`~recallserve.serve.traces.build_trace`) and store it for ``tenant``."""
        if not self.config.enabled:
            return
        trace = build_trace(turn, request_id=request_id, user=user, path=path, stream=stream, answer=answer,
                            finish=finish, prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                            prompt=prompt, agent_meta=agent_meta, started=started, config=self.config,
                            experience=experience)
        await self.store.put(tenant, trace)
