"""The one interface every chat model role (router, reasoner, summariser) is called through.

Adapters live in ``deployments/engines/`` (llama.cpp, vLLM, remote OpenAI-compatible); the
request pipeline in ``serve/`` only ever sees :class:`LLMEngine`.
"""

from __future__ import annotations

import hashlib
from collections.abc import AsyncIterator, Sequence
from contextvars import ContextVar
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import Field

from recallserve.kernels import StrictModel

__all__ = [
    "ChatMessage",
    "GenerationParams",
    "ChatResult",
    "ChatDelta",
    "LLMEngine",
    "EngineError",
    "engine_affinity",
    "set_engine_affinity",
]

engine_affinity: ContextVar[str | None] = ContextVar("recallserve_engine_affinity", default=None)
"""The conversation the current request's engine calls belong to (a hash; None = none).

Engines with several replicas (Ray Serve deployments) route calls with the same value to the same
replica, whose prefix cache holds that conversation's earlier prompt (the system prompt, the tool
list and the turns so far); see ``deployments/affinity.py``. Plain engines ignore it.
"""


def set_engine_affinity(tenant: str, conversation: str | None) -> None:
    """Mark the current request's engine calls as ``tenant``'s ``conversation`` (session id or user).

    The value is a hash, so no tenant, user or session id travels to the routing layer.
    """
    engine_affinity.set(
        hashlib.sha256(f"{tenant}\x1f{conversation}".encode()).hexdigest()[:16] if conversation else None)


class EngineError(RuntimeError):
    """An engine failed to produce an answer (load error, crash, timeout)."""


class ChatMessage(StrictModel):
    """One message as the engines see it (OpenAI roles, plain text content)."""

    role: Literal["system", "user", "assistant", "tool"] = Field(description="Author role.")
    content: str = Field(description="Plain-text content.")


class GenerationParams(StrictModel):
    """Sampling and constraint parameters for one generation."""

    max_tokens: int = Field(default=256, ge=1, le=32768, description="Most tokens to generate.")
    temperature: float = Field(default=0.2, ge=0.0, le=2.0, description="Sampling temperature.")
    top_p: float = Field(default=0.95, gt=0.0, le=1.0, description="Nucleus sampling mass.")
    stop: list[str] = Field(default_factory=list, description="Stop strings.")
    seed: int | None = Field(default=None, description="Sampling seed, when the engine supports it.")
    # NOTE: OpenAI's definition, which llama.cpp and vLLM share: a token's logit is lowered by
    # ``presence_penalty * (count > 0) + frequency_penalty * count``, count = its uses so far.
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, description="Lowers the logit of every token already used.")
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0,
                                     description="Lowers a token's logit in proportion to its uses so far.")
    json_schema: dict[str, Any] | None = Field(
        default=None,
        description="When set, the reply is constrained to JSON matching this JSON schema.",
    )


class ChatResult(StrictModel):
    """A finished, non-streamed generation."""

    text: str = Field(description="Generated text.")
    prompt_tokens: int = Field(ge=0, description="Tokens in the prompt, by the engine's tokenizer.")
    completion_tokens: int = Field(ge=0, description="Tokens generated.")
    finish_reason: Literal["stop", "length"] = Field(description="Why generation ended.")
    model: str = Field(description="Model name that produced it.")
    cached_tokens: int = Field(
        default=0, ge=0,
        description="Prompt tokens reused from the engine's prefix cache (not evaluated again); "
                    "``prompt_tokens - cached_tokens`` were evaluated for this call.",
    )
    engine_ms: float = Field(
        default=0.0, ge=0, description="Milliseconds the engine worked on this call (its own queue wait excluded "
                                       "where the engine can tell), for the pipeline's overhead: wall - engine.",
    )


class ChatDelta(StrictModel):
    """One streamed piece; the last one carries ``finish_reason`` and token counts."""

    text: str = Field(default="", description="New text since the previous delta.")
    finish_reason: Literal["stop", "length"] | None = Field(default=None, description="Set on the last delta.")
    prompt_tokens: int | None = Field(default=None, description="Set on the last delta.")
    completion_tokens: int | None = Field(default=None, description="Set on the last delta.")
    cached_tokens: int | None = Field(default=None, description="Set on the last delta (see ChatResult).")
    engine_ms: float | None = Field(default=None, description="Set on the last delta (see ChatResult).")


@runtime_checkable
class LLMEngine(Protocol):
    """A chat model. Implementations must not block the caller's event loop."""

    @property
    def model_name(self) -> str:
        """Name reported in responses and metrics."""
        ...

    @property
    def context_window(self) -> int:
        """Context length in tokens (prompt + completion)."""
        ...

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        """Generate one full reply."""
        ...

    def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        """Generate a reply piece by piece."""
        ...

    async def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` by the engine's own tokenizer."""
        ...

    async def close(self) -> None:
        """Release the model."""
        ...
