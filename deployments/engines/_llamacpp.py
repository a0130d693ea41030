"""The llama.cpp adapter: a GGUF model in-process, the CPU default.

A ``llama_cpp.Llama`` holds one KV cache and is not thread-safe, so every generation runs on
one dedicated worker thread (a single-thread executor): calls are served one at a time in
arrival order, the event loop never blocks, and llama.cpp's prefix reuse keeps a stable
system prompt warm between calls. A long system prompt's KV state is also saved and put back
after other prompts ran in between (:mod:`recallserve.deployments.engines._prefix_states`). Tokenising only
reads the vocabulary and runs beside it.
"""

from __future__ import annotations

import asyncio
import os
import threading
import time
from collections.abc import AsyncIterator, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from recallserve.deployments.engines._common import finish_reason, iterate_in_thread, sampling_kwargs, to_openai_messages
from recallserve.deployments.engines._config import LlamaCppConfig
from recallserve.deployments.engines._lazy_grammar import install as install_lazy_grammar
from recallserve.deployments.engines._prefix_states import PrefixStates
from recallserve.deployments.models import ModelError, resolve_model_path
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, EngineError, GenerationParams

__all__ = ["LlamaCppEngine"]


@dataclass
class _Job:
    """Per-generation state read by the ``generate`` hook (one job at a time: single worker)."""

    cancel: threading.Event = field(default_factory=threading.Event)
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0
    started: float = 0.0  # perf_counter when the worker thread took the job
    system_tokens: int = 0  # tokens of the prompt's system message (what a saved state must cover)


class LlamaCppEngine:
    """:class:`recallserve.serve.engine.LLMEngine` over llama-cpp-python.

    Example:
        >>> engine = LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1"))  # doctest: +SKIP
        >>> (await engine.chat([ChatMessage(role="user", content="hi")], GenerationParams())).text  # doctest: +SKIP
    """

    def __init__(self, config: LlamaCppConfig) -> None:
        """Resolve (join and verify if needed) and load the model; blocking, ~1 s for 1 GB.

        Raises:
            EngineError: the model is missing, corrupt or llama.cpp cannot load it.
        """
        # NOTE: llama.cpp's CPU backend runs on OpenMP. With the default (spinning) wait policy,
        # idle OpenMP threads burn their cores between graph steps; with several engines (one per
        # model role) on 2 shared cores that was ~10x slower here (a 13-token JSON reply: 26 s
        # spinning vs 2.4 s passive, n_threads=2, load ~10). It only takes effect when set
        # before the OpenMP runtime loads, hence here, before the first `import llama_cpp`.
        os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
        try:
            import llama_cpp
        except ImportError as exc:  # pragma: no cover - a core dependency
            raise EngineError("llama-cpp-python is not installed: pip install recallserve") from exc
        try:
            path = resolve_model_path(config.model)
        except ModelError as exc:
            raise EngineError(str(exc)) from exc
        if path.is_dir():
            raise EngineError(f"model.path: {path} is a folder; the llama.cpp engine needs a GGUF file")
        self._config = config
        self._name = config.model.display_name
        self._llama_cpp = llama_cpp
        try:
            self._llm = llama_cpp.Llama(
                model_path=str(path),
                n_ctx=config.n_ctx,
                n_threads=config.n_threads,
                n_batch=config.n_batch,
                chat_format=config.chat_format,
                seed=config.seed,
                verbose=config.verbose,
            )
        except (ValueError, RuntimeError, OSError) as exc:
            raise EngineError(f"llama.cpp could not load {path}: {exc}") from exc
        self._job: _Job | None = None
        # NOTE: generation goes through `Llama.generate`; wrapping it on the instance is the one
        # place that sees the exact prompt length, every sampled token and can stop between
        # tokens (create_chat_completion takes no stopping criteria of its own).
        self._generate = self._llm.generate
        self._llm.generate = self._hooked_generate  # type: ignore[method-assign]
        if config.lazy_grammar:
            install_lazy_grammar(self._llm, llama_cpp)
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix=f"llama-{self._name}")
        self._closed = False
        self.prefix_states = PrefixStates(config.prefix_states, config.prefix_state_max_mb << 20,
                                          config.prefix_state_min_tokens, min_gain=32)

    @property
    def model_name(self) -> str:
        """The built-in name or the GGUF file's stem."""
        return self._name

    @property
    def context_window(self) -> int:
        """``n_ctx`` as loaded."""
        return int(self._llm.n_ctx())

    def _hooked_generate(self, tokens: Sequence[int], *args: Any, **kwargs: Any) -> Iterator[int]:
        job = self._job
        if job is not None:
            # NOTE: a saved state sharing more of this prompt than the live cache is put back first,
            # so the count below includes what it restored.
            self.prefix_states.restore(self._llm, self._llama_cpp, tokens)
            job.prompt_tokens = len(tokens)
            job.cached_tokens = self._reused_prefix(tokens)
        vocab = self._llm._model.vocab  # noqa: SLF001 - needed for the end-of-generation test
        first = True
        for token in self._generate(tokens, *args, **kwargs):
            if first and job is not None:
                # NOTE: before the first sampled token is evaluated the cache holds exactly the
                # prompt: the state worth keeping for the next request with this system prompt.
                self.prefix_states.maybe_save(self._llm, self._llama_cpp, job.system_tokens)
            first = False
            if job is not None:
                if job.cancel.is_set():
                    return
                if not self._llama_cpp.llama_vocab_is_eog(vocab, token):
                    job.completion_tokens += 1
            yield token

    def _reused_prefix(self, tokens: Sequence[int]) -> int:
        """Prompt tokens ``Llama.generate`` will take from its KV cache instead of evaluating.

        llama-cpp-python keeps the last call's tokens and, on the next call, skips the longest
        common prefix of those and ``tokens[:-1]`` (the last prompt token is always evaluated, to
        get its logits); this is the same count, taken before it runs.
        """
        n = 0
        for a, b in zip(self._llm._input_ids, tokens[:-1]):  # noqa: SLF001 - the cache's tokens
            if a != b:
                break
            n += 1
        return n

    def _system_tokens(self, messages: Sequence[ChatMessage]) -> int:
        """Tokens of the leading system message (0 without one, or when states are off)."""
        if not self.prefix_states.enabled or not messages or messages[0].role != "system":
            return 0
        return len(self._llm.tokenize(messages[0].content.encode("utf-8"), False, True))

    def _request(self, messages: Sequence[ChatMessage], params: GenerationParams, stream: bool) -> dict[str, Any]:
        kwargs = sampling_kwargs(params)
        kwargs.update(messages=to_openai_messages(messages), stream=stream, model=self._name)
        if params.json_schema is not None:
            kwargs["response_format"] = {"type": "json_object", "schema": params.json_schema}
        return kwargs

    def _check_open(self) -> None:
        if self._closed:
            raise EngineError(f"engine {self._name} is closed")

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        """Generate one reply on the worker thread; cancelling the caller stops generation."""
        self._check_open()
        request = self._request(messages, params, stream=False)
        job = _Job()

        def work() -> dict[str, Any] | None:
            if job.cancel.is_set():  # abandoned while queued
                return None
            job.started = time.perf_counter()
            job.system_tokens = self._system_tokens(messages)
            self._job = job
            try:
                return self._llm.create_chat_completion(**request)  # type: ignore[return-value]
            finally:
                self._job = None

        loop = asyncio.get_running_loop()
        try:
            out = await loop.run_in_executor(self._executor, work)
        except asyncio.CancelledError:
            job.cancel.set()
            raise
        except Exception as exc:
            raise EngineError(f"llama.cpp generation failed ({self._name}): {exc}") from exc
        if out is None:  # pragma: no cover - only when cancelled, and then CancelledError won
            raise EngineError(f"generation on {self._name} was cancelled")
        choice = out["choices"][0]
        usage = out["usage"]
        return ChatResult(
            text=choice["message"]["content"] or "",
            prompt_tokens=usage["prompt_tokens"],
            completion_tokens=usage["completion_tokens"],
            finish_reason=finish_reason(choice["finish_reason"]),
            model=self._name,
            cached_tokens=min(job.cached_tokens, usage["prompt_tokens"]),
            engine_ms=1e3 * (time.perf_counter() - job.started),
        )

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        """Yield text deltas as llama.cpp produces them; the last delta carries counts.

        Closing the iterator early (client gone) stops generation before the next token.
        """
        self._check_open()
        request = self._request(messages, params, stream=True)

        def produce(cancel: threading.Event) -> Iterator[ChatDelta]:
            job = _Job(cancel=cancel, started=time.perf_counter(), system_tokens=self._system_tokens(messages))
            self._job = job
            try:
                reason: str | None = None
                for chunk in self._llm.create_chat_completion(**request):
                    choice = chunk["choices"][0]  # type: ignore[index]
                    text = choice["delta"].get("content")
                    if text:
                        yield ChatDelta(text=text)
                    reason = choice.get("finish_reason") or reason
                yield ChatDelta(
                    finish_reason=finish_reason(reason),
                    prompt_tokens=job.prompt_tokens,
                    completion_tokens=job.completion_tokens,
                    cached_tokens=job.cached_tokens,
                    engine_ms=1e3 * (time.perf_counter() - job.started),
                )
            finally:
                self._job = None

        try:
            async for delta in iterate_in_thread(self._executor, produce):
                yield delta
        except EngineError:
            raise
        except Exception as exc:
            raise EngineError(f"llama.cpp generation failed ({self._name}): {exc}") from exc

    async def count_tokens(self, text: str) -> int:
        """Tokens in ``text`` by the model's tokenizer (no BOS; special tokens parsed as such)."""
        self._check_open()
        data = text.encode("utf-8")
        # NOTE: tokenising only reads the vocabulary, so it does not queue behind a generation.
        tokens = await asyncio.to_thread(self._llm.tokenize, data, False, True)
        return len(tokens)

    async def close(self) -> None:
        """Finish queued work, then free the model."""
        if self._closed:
            return
        self._closed = True
        await asyncio.get_running_loop().run_in_executor(None, self._executor.shutdown, True)
        self._llm.close()
