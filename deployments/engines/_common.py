"""Helpers shared by the engine adapters: thread-to-async streaming and OpenAI message shapes."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from concurrent.futures import Executor
from typing import Any, Literal, TypeVar

from recallserve.serve.engine import ChatMessage, GenerationParams

__all__ = ["to_openai_messages", "finish_reason", "iterate_in_thread", "sampling_kwargs"]

T = TypeVar("T")
_END = object()


def to_openai_messages(messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
    """``[{"role", "content"}]`` dicts as chat templates and OpenAI endpoints expect them."""
    if not messages:
        raise ValueError("messages: at least one message is required")
    return [{"role": m.role, "content": m.content} for m in messages]


def finish_reason(raw: str | None) -> Literal["stop", "length"]:
    """Map an engine's finish reason onto the protocol's two values (``length`` only when truncated)."""
    return "length" if raw == "length" else "stop"


def sampling_kwargs(params: GenerationParams) -> dict[str, Any]:
    """The OpenAI-named sampling arguments common to every adapter."""
    kwargs: dict[str, Any] = {
        "max_tokens": params.max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
    }
    if params.stop:
        kwargs["stop"] = list(params.stop)
    if params.seed is not None:
        kwargs["seed"] = params.seed
    # NOTE: only when set: a neutral sampler keeps llama.cpp's greedy grammar fast path (_lazy_grammar).
    for name in ("presence_penalty", "frequency_penalty"):
        if getattr(params, name):
            kwargs[name] = getattr(params, name)
    return kwargs


async def iterate_in_thread(
    executor: Executor, produce: Callable[[threading.Event], Iterator[T]]
) -> AsyncIterator[T]:
    """Run a blocking iterator on ``executor`` and yield its items on the event loop.

    ``produce(cancel)`` is called on the worker thread; it must stop soon after ``cancel`` is
    set. The event is set when the consumer stops early (``aclose``, ``break``, task
    cancellation), so an abandoned stream stops generating instead of running to
    ``max_tokens`` while holding the model. Items cross threads through
    ``loop.call_soon_threadsafe``; exceptions raised by the worker are re-raised here.
    """
    loop = asyncio.get_running_loop()
    queue: asyncio.Queue[tuple[Any, BaseException | None]] = asyncio.Queue()
    cancel = threading.Event()

    def put(item: Any, error: BaseException | None = None) -> None:
        try:
            loop.call_soon_threadsafe(queue.put_nowait, (item, error))
        except RuntimeError:  # NOTE: the loop closed while we generated; nobody is listening.
            cancel.set()

    def worker() -> None:
        if cancel.is_set():  # abandoned while waiting for the executor
            return
        try:
            for item in produce(cancel):
                put(item)
                if cancel.is_set():
                    break
        except BaseException as exc:  # noqa: BLE001 - forwarded to the consumer
            put(_END, exc)
        else:
            put(_END)

    loop.run_in_executor(executor, worker)
    try:
        while True:
            item, error = await queue.get()
            if item is _END:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        cancel.set()
