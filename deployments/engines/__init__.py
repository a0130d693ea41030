"""LLM engine adapters behind :class:`recallserve.serve.engine.LLMEngine`: llama.cpp, vLLM, remote OpenAI.

Pick one per model role in config (``kind``) and build it with :func:`build_engine`.

Example:
    >>> from recallserve.deployments.engines import build_engine, parse_engine_config
    >>> engine = build_engine(parse_engine_config({"kind": "llama_cpp", "model": "smollm2-135m-instruct-q4_1"}))  # doctest: +SKIP
"""

from __future__ import annotations

from recallserve.deployments.engines._config import EngineConfig, LlamaCppConfig, RemoteConfig, VLLMConfig, parse_engine_config
from recallserve.deployments.engines._llamacpp import LlamaCppEngine
from recallserve.deployments.engines._remote import RemoteOpenAIEngine
from recallserve.deployments.engines._vllm import VLLMEngine
from recallserve.serve.engine import LLMEngine

__all__ = [
    "EngineConfig",
    "LlamaCppConfig",
    "VLLMConfig",
    "RemoteConfig",
    "parse_engine_config",
    "build_engine",
    "LlamaCppEngine",
    "RemoteOpenAIEngine",
    "VLLMEngine",
]


def build_engine(config: LlamaCppConfig | VLLMConfig | RemoteConfig) -> LLMEngine:
    """Construct the adapter ``config.kind`` names (blocking: loads the model for local kinds).

    Raises:
        serve.engine.EngineError: the model or endpoint configuration cannot be used.
    """
    if isinstance(config, LlamaCppConfig):
        return LlamaCppEngine(config)
    if isinstance(config, VLLMConfig):
        return VLLMEngine(config)
    if isinstance(config, RemoteConfig):
        return RemoteOpenAIEngine(config)
    raise TypeError(f"engine: unsupported config type {type(config).__name__}")
