"""Adapters that make Ray Serve deployment handles look like plain ``serve`` interfaces.

The request pipeline only knows :class:`~recallserve.serve.engine.LLMEngine`; :class:`HandleEngine`
forwards each call to a model-role deployment, so ``serve/`` never imports Ray.
"""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from typing import Any

from ray.exceptions import RayError
from ray.serve.exceptions import BackPressureError, RayServeException
from ray.serve.handle import DeploymentHandle

from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, EngineError, GenerationParams, engine_affinity

__all__ = ["HandleEngine", "on_data_plane"]

_FAILURES = (RayError, RayServeException, BackPressureError)


def on_data_plane(value: Any, grpc: bool) -> Any:
    """``value`` with every deployment handle in it (nested in dicts and lists) set to the gRPC data plane or not.

    NOTE: a handle's transport is an option fixed where the handle was made: the handles a
    replica receives through ``bind()`` were made by the driver, whose Ray Serve was imported
    before ``ray.throughput_optimized`` could switch Serve to gRPC (runner.start_ray),
    so they would keep Ray actor calls. The replica that calls them sets it here, from config.
    """
    if isinstance(value, DeploymentHandle):
        return value.options(_by_reference=not grpc)
    if isinstance(value, dict):
        return {k: on_data_plane(v, grpc) for k, v in value.items()}
    if isinstance(value, list):
        return [on_data_plane(v, grpc) for v in value]
    return value


class HandleEngine:
    """An :class:`~recallserve.serve.engine.LLMEngine` backed by a ``ModelRole`` deployment handle."""

    def __init__(self, handle: DeploymentHandle, role: str, model_name: str, context_window: int) -> None:
        self._handle = handle
        self._role = role
        self._model_name = model_name
        self._context_window = context_window

    @property
    def model_name(self) -> str:
        return self._model_name

    @property
    def context_window(self) -> int:
        return self._context_window

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        try:
            # NOTE: affinity is read by the role's request router (deployments/affinity.py) only.
            return await self._handle.chat.remote(list(messages), params, affinity=engine_affinity.get())
        except EngineError:
            raise
        except _FAILURES as exc:
            raise EngineError(f"{self._role} deployment failed: {type(exc).__name__}: {exc}") from exc

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        gen = self._handle.options(stream=True).stream.remote(list(messages), params, affinity=engine_affinity.get())
        try:
            async for delta in gen:
                yield delta
        except EngineError:
            raise
        except _FAILURES as exc:
            raise EngineError(f"{self._role} deployment failed mid-stream: {type(exc).__name__}: {exc}") from exc
        finally:
            gen.cancel()

    async def count_tokens(self, text: str) -> int:
        try:
            return await self._handle.count_tokens.remote(text)
        except _FAILURES as exc:
            raise EngineError(f"{self._role} deployment failed: {exc}") from exc

    async def close(self) -> None:
        """Handles own nothing to release."""
