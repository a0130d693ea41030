"""Helpers for the context-mode tests: a lexical hashing embedder (tests only), a stub engine
for the summariser/classifier seams, and a manager on a throwaway store."""

from __future__ import annotations

import asyncio
import hashlib
import re
from collections.abc import AsyncIterator, Coroutine, Sequence
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
import pytest

from recallserve.serve.context import ContextConfig, ContextManager, SessionStore
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, GenerationParams

_T = TypeVar("_T")
_WORD = re.compile(r"[a-z0-9]+")
_STOP = {"the", "a", "an", "is", "my", "i", "to", "of", "and", "it", "you", "me", "what", "did", "do", "for",
         "in", "on", "was", "which", "with", "that", "this", "be", "your", "are", "can"}


def hashing_embed(texts: Sequence[str], dim: int = 512) -> np.ndarray:
    """Bag of words hashed into ``dim`` buckets (sha1, so stable across runs); stop words skipped.

    A real lexical embedding: texts sharing content words get a high cosine. Used only to isolate
    the retrieval logic from a neural model in unit tests.
    """
    out = np.zeros((len(texts), dim), dtype=np.float32)
    for i, text in enumerate(texts):
        for word in _WORD.findall(text.lower()):
            if word in _STOP:
                continue
            out[i, int(hashlib.sha1(word.encode()).hexdigest(), 16) % dim] += 1.0
    return out


def run(coro: Coroutine[Any, Any, _T]) -> _T:
    """Run a coroutine to completion (no pytest-asyncio in the environment)."""
    return asyncio.run(coro)


class StubEngine:
    """A test double of :class:`recallserve.serve.engine.LLMEngine` that answers from a list and records prompts."""

    def __init__(self, replies: Sequence[str], name: str = "stub-model") -> None:
        self.replies = list(replies)
        self.prompts: list[list[ChatMessage]] = []
        self.params: list[GenerationParams] = []
        self._name = name

    @property
    def model_name(self) -> str:
        return self._name

    @property
    def context_window(self) -> int:
        return 8192

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        self.prompts.append(list(messages))
        self.params.append(params)
        text = self.replies.pop(0) if self.replies else "- (nothing)"
        return ChatResult(text=text, prompt_tokens=1, completion_tokens=1, finish_reason="stop", model=self._name)

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        result = await self.chat(messages, params)
        yield ChatDelta(text=result.text, finish_reason="stop")

    async def count_tokens(self, text: str) -> int:
        return len(text.split())

    async def close(self) -> None:
        return None


@pytest.fixture
def store(tmp_path: Path, state_db: Any) -> SessionStore:
    """A store in a temp file, or on a fresh PostgreSQL schema (``state_db``; closed after the test)."""
    s = SessionStore(tmp_path / "ctx.sqlite3", db=state_db)
    yield s
    s.close()


@pytest.fixture
def manager(store: SessionStore) -> ContextManager:
    """A manager with the hashing embedder and a controllable clock (``manager.now[0]``)."""
    now = [1_767_225_600.0]
    m = ContextManager(store, ContextConfig(), embed=hashing_embed, clock=lambda: now[0])
    m.now = now  # type: ignore[attr-defined]
    return m
