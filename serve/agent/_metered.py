"""Engine calls under one request's deadline, metered into its :class:`AgentUsage`.

Every engine call of an agent request goes through one :class:`MeteredCalls`: each call may take
``min(deadline - now, engine_timeout_s)`` seconds (for a stream: each delta), and a call that
runs past it raises :class:`Deadline` so the loop answers with what it has. The prompt, cached,
generated token counts and the engine's own milliseconds add up in ``usage``.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator

from recallserve.serve.agent.schemas import AgentUsage
from recallserve.serve.engine import ChatMessage, GenerationParams, LLMEngine

__all__ = ["Deadline", "MeteredCalls"]


class Deadline(Exception):
    """The request deadline passed during an engine call."""


class MeteredCalls:
    """Chat and stream calls bounded by ``deadline`` (a ``time.perf_counter()`` instant).

    Args:
        deadline: when the request must end.
        engine_timeout_s: the most one call (or one stream delta) may take.
        usage: the request's usage, updated by every call.
    """

    def __init__(self, deadline: float, engine_timeout_s: float, usage: AgentUsage) -> None:
        self.deadline = deadline
        self.engine_timeout_s = engine_timeout_s
        self.usage = usage
        self.last_finish: str | None = None
        """Why the last call's generation ended ("stop" / "length"; None before any call)."""

    def remaining(self) -> float:
        """Seconds the next wait may take; raises :class:`Deadline` when none are left."""
        left = self.deadline - time.perf_counter()
        if left <= 0:
            raise Deadline()
        return min(left, self.engine_timeout_s)

    async def chat(self, engine: LLMEngine, messages: list[ChatMessage], params: GenerationParams) -> str:
        """One non-streamed call; returns its text."""
        try:
            res = await asyncio.wait_for(engine.chat(messages, params), timeout=self.remaining())
        except TimeoutError:
            raise Deadline() from None
        u = self.usage
        u.prompt_tokens += res.prompt_tokens
        u.cached_tokens += res.cached_tokens
        u.engine_ms += res.engine_ms
        u.completion_tokens += res.completion_tokens
        u.engine_calls += 1
        self.last_finish = res.finish_reason
        return res.text

    async def stream(self, engine: LLMEngine, messages: list[ChatMessage],
                     params: GenerationParams) -> AsyncIterator[str]:
        """Yield the raw text deltas of one streamed call (usage from the deltas that carry it)."""
        u = self.usage
        u.engine_calls += 1
        self.last_finish = None
        it = engine.stream(messages, params).__aiter__()
        try:
            while True:
                try:
                    delta = await asyncio.wait_for(it.__anext__(), timeout=self.remaining())
                except StopAsyncIteration:
                    return
                except TimeoutError:
                    raise Deadline() from None
                if delta.prompt_tokens is not None:
                    u.prompt_tokens += delta.prompt_tokens
                if delta.cached_tokens is not None:
                    u.cached_tokens += delta.cached_tokens
                if delta.engine_ms is not None:
                    u.engine_ms += delta.engine_ms
                if delta.completion_tokens is not None:
                    u.completion_tokens += delta.completion_tokens
                if delta.finish_reason is not None:
                    self.last_finish = delta.finish_reason
                if delta.text:
                    yield delta.text
        finally:
            aclose = getattr(it, "aclose", None)
            if aclose is not None:
                await aclose()
