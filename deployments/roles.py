"""A model role (router, reasoner or summariser) as a Ray Serve deployment body.

The class is plain Python (an engine built from config, async methods); ``deployments/app.py``
wraps it with ``serve.deployment``. Each role is its own deployment so it scales and is
addressed separately, even when a CPU profile points all three at the same GGUF file
(llama.cpp mmaps the file, so the weights' pages are shared between the processes).
"""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator

from recallserve.deployments._placement import PlacementInfo
from recallserve.deployments.engines import EngineConfig, build_engine
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, GenerationParams

__all__ = ["ModelRole"]

log = logging.getLogger("recallserve.roles")


class ModelRole(PlacementInfo):
    """Serves one role's engine to the ingress through a deployment handle."""

    def __init__(self, role: str, engine: EngineConfig) -> None:
        self.role = role
        self.engine = build_engine(engine)
        log.info("role %s ready: %s", role, self.engine.model_name)

    async def info(self) -> dict[str, object]:
        """Model name and context window of this role."""
        return {"role": self.role, "model": self.engine.model_name, "context_window": self.engine.context_window}

    async def chat(self, messages: list[ChatMessage], params: GenerationParams,
                   affinity: str | None = None) -> ChatResult:
        """One full generation (``affinity`` only steers the request router, see deployments/affinity.py)."""
        return await self.engine.chat(messages, params)

    async def stream(self, messages: list[ChatMessage], params: GenerationParams,
                     affinity: str | None = None) -> AsyncIterator[ChatDelta]:
        """A streamed generation (called with ``handle.options(stream=True)``; ``affinity`` as for chat)."""
        async for delta in self.engine.stream(messages, params):
            yield delta

    async def count_tokens(self, text: str) -> int:
        """Tokens by the engine's tokenizer."""
        return await self.engine.count_tokens(text)

    async def check_health(self) -> None:
        """Ray Serve health check: the engine object must exist."""
        if self.engine is None:  # pragma: no cover - defensive
            raise RuntimeError(f"{self.role}: engine is gone")
