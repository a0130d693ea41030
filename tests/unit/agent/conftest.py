"""Test doubles that isolate the agent loop: a scripted engine and a substring memory."""

from __future__ import annotations

import asyncio
import json
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

import pytest

from recallserve.memory_shards.records import MemoryRecord
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, GenerationParams
from recallserve.serve.memory import MemoryHit, MemoryWrite
from recallserve.serve.agent import Agent, AgentRequest, AgentResult
from recallserve.serve.agent.demo.tools import DEMO_SCOPES
from recallserve.serve.pipeline import agent_turn
from recallserve.serve.turn import Turn

Reply = str | Callable[[Sequence[ChatMessage], GenerationParams], str]


class ScriptedEngine:
    """An LLMEngine that replies from a script (one entry per call), recording every call.

    Used only in unit tests that isolate the loop logic (the real model is exercised in the
    SmolLM2 plumbing test and the eval).
    """

    def __init__(self, replies: Sequence[Reply], delay_s: float = 0.0, chunk: int = 5) -> None:
        self.replies = list(replies)
        self.calls: list[tuple[list[ChatMessage], GenerationParams]] = []
        self.delay_s = delay_s
        self.chunk = chunk

    @property
    def model_name(self) -> str:
        return "scripted"

    @property
    def context_window(self) -> int:
        return 8192

    def _next(self, messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        self.calls.append((list(messages), params))
        if not self.replies:
            raise AssertionError(f"script exhausted at call {len(self.calls)}")
        reply = self.replies.pop(0)
        return reply(messages, params) if callable(reply) else reply

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        text = self._next(messages, params)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        return ChatResult(text=text, prompt_tokens=10, completion_tokens=len(text) // 4, finish_reason="stop",
                          model="scripted")

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        text = self._next(messages, params)
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        for i in range(0, len(text), self.chunk):
            yield ChatDelta(text=text[i : i + self.chunk])
        yield ChatDelta(text="", finish_reason="stop", prompt_tokens=10, completion_tokens=len(text) // 4)

    async def count_tokens(self, text: str) -> int:
        return len(text) // 4

    async def close(self) -> None:
        return None


class SubstringMemory:
    """A MemoryBackend double: a hit when any query word of 4+ letters occurs in the text, at a cosine of
    0.6 (a shared word, no paraphrase), or ``close[source_id]`` for the records given there."""

    def __init__(self, texts: dict[str, str] | None = None, close: dict[str, float] | None = None) -> None:
        self.items: dict[str, list[MemoryWrite]] = {}
        self.close = dict(close or {})
        self.searches = 0
        for sid, text in (texts or {}).items():
            self.items.setdefault("t1", []).append(MemoryWrite(text=text, source_id=sid))

    async def search(self, tenant: str, query: str, k: int | None = None, *, threshold: float | None = None,
                     kinds: Sequence[str] | None = None, topic_prefix: str | None = None,
                     user: str | None = None) -> list[MemoryHit]:
        self.searches += 1
        words = {w.lower().strip("?.,!") for w in query.split() if len(w) >= 4}
        out = []
        for i, it in enumerate(self.items.get(tenant, [])):
            if kinds is not None and it.kind not in kinds:
                continue
            if any(w in it.text.lower() for w in words):
                record = MemoryRecord(id=f"m{i}", tenant=tenant, source_id=it.source_id or f"m{i}", kind=it.kind,
                                      text=it.text, created_at=0.0, metadata=dict(it.metadata))
                cosine = self.close.get(it.source_id or "", 0.6)
                out.append(MemoryHit(record=record, score=0.8, similarity=cosine, time_factor=1.0, part_index=0, shard=0))
        return out[:k]

    async def write(self, tenant: str, items: Sequence[MemoryWrite]) -> list[str]:
        self.items.setdefault(tenant, []).extend(items)
        return [f"w{i}" for i in range(len(items))]


def call(name: str, thought: str = "need a tool", **args: Any) -> str:
    """A scripted tool_call reply."""
    return json.dumps({"thought": thought, "type": "tool_call", "name": name, "args": args})


def final(answer: str) -> str:
    """A scripted final reply."""
    return json.dumps({"thought": "done", "type": "final", "answer": answer})


def route(kind: str, *tools: str) -> str:
    """A scripted router reply (``kind`` documents the intent: direct = no tools)."""
    assert (kind == "direct") == (not tools)
    return json.dumps({"tools": list(tools)})


@pytest.fixture
def memory() -> SubstringMemory:
    return SubstringMemory({
        "ticket:T-1042": "Ticket T-1042: error E42 on batch B-2207, fixed by replacing the TF-185 thermal fuse.",
        "manual:7.1": "Warranty: two years on all parts.",
    })


def user(content: str | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """One OpenAI user message (text, or content parts)."""
    return [{"role": "user", "content": content}]


async def turn_for(agent: Agent, messages: str | list[dict[str, Any]], *, tenant: str = "t1",
                   scopes: Sequence[str] | None = None, mode: str = "auto",
                   session_id: str | None = None, max_tokens: int | None = None) -> tuple[AgentRequest, Turn]:
    """The agent's request and turn for ``messages`` (a string = one user message), built by the
    chat pipeline exactly as for an HTTP request (:func:`recallserve.serve.pipeline.agent_turn`).
    ``session_id``: the id write-backs are stored with (no session store is opened here)."""
    msgs = user(messages) if isinstance(messages, str) else messages
    request, turn = await agent_turn(agent, msgs, tenant=tenant, scopes=list(scopes or DEMO_SCOPES), mode=mode,
                                     max_tokens=max_tokens)
    return (request.model_copy(update={"session_id": session_id}) if session_id else request), turn


def run_agent(agent: Agent, messages: str | list[dict[str, Any]], **kw: Any) -> AgentResult:
    """Run ``agent`` to the end on the turn :func:`turn_for` builds."""
    async def go() -> AgentResult:
        request, turn = await turn_for(agent, messages, **kw)
        return await agent.run(request, turn)

    return asyncio.run(go())
