"""Query decomposition on the memory search: the router model's sub-queries are searched and fused, through HTTP.

The engine here replies from a script (the real router model is run by ``recallserve eval locomo
--decompose``, whose figures are in loadtests/results/locomo-decompose.md); every other piece
(service, retriever, shards, BM25, fusion, router, error handlers) is the real code.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from recallserve.deployments.cli._decompose_cache import (
    CachedDecomposer,
    DecompositionCache,
)
from recallserve.serve.engine import (
    ChatDelta,
    ChatMessage,
    ChatResult,
    EngineError,
    GenerationParams,
)
from recallserve.serve.memory_api import MemoryService
from recallserve.serve.memory_api.decompose import (
    DECOMPOSE_SYSTEM,
    DecomposeConfig,
    Decomposition,
    QueryDecomposer,
    parse_subqueries,
    prompt_key,
)

from .conftest import auth

A = auth("sk-acme")


class RouterEngine:
    """An LLMEngine answering every call with ``reply`` (or raising it), recording the prompts it received."""

    def __init__(self, reply: str | BaseException, delay_s: float = 0.0) -> None:
        self.reply = reply
        self.delay_s = delay_s
        self.calls: list[tuple[list[ChatMessage], GenerationParams]] = []

    @property
    def model_name(self) -> str:
        return "router-test"

    @property
    def context_window(self) -> int:
        return 1024

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        self.calls.append((list(messages), params))
        if self.delay_s:
            await asyncio.sleep(self.delay_s)
        if isinstance(self.reply, BaseException):
            raise self.reply
        return ChatResult(text=self.reply, prompt_tokens=90, completion_tokens=12, finish_reason="stop", model="router-test")

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        raise NotImplementedError
        yield  # pragma: no cover

    async def count_tokens(self, text: str) -> int:
        return len(text) // 4

    async def close(self) -> None:
        return None


MEMORIES = [
    {"text": "Tom told me his surfing teacher was Kai", "metadata": {"speaker": "Ann"}},
    {"text": "Kai grew up in Portugal near Lisbon", "metadata": {"speaker": "Ann"}},
    {"text": "the weather was nice on Tuesday"},
    {"text": "we had pasta for dinner"},
    {"text": "the printer on floor 3 is out of toner"},
]
QUESTION = "Which country is Tom's surfing teacher from?"


def _search(client: TestClient, body: dict) -> list[str]:
    r = client.post("/v1/memories/search", json={"decay": {"decay": "none"}, "threshold": 0.0, **body}, headers=A)
    assert r.status_code == 200, r.text
    return [h["text"] for h in r.json()["data"]]


@pytest.fixture
def ids(client: TestClient) -> list[str]:
    r = client.post("/v1/memories", json={"memories": MEMORIES}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["ids"]


def test_a_sub_query_brings_in_the_second_hop(client: TestClient, service: MemoryService, ids: list[str]) -> None:
    engine = RouterEngine("1. Tom's surfing teacher\n2. Kai grew up in\n3. home country")
    service.decomposer = QueryDecomposer(engine)
    plain = _search(client, {"query": QUESTION, "k": 2})
    assert "Kai grew up in Portugal near Lisbon" not in plain
    assert engine.calls == []  # off by default: no model call
    decomposed = _search(client, {"query": QUESTION, "k": 2, "decompose": True})
    assert decomposed[0] == "Tom told me his surfing teacher was Kai"
    assert "Kai grew up in Portugal near Lisbon" in decomposed
    # The prompt the router received: the fixed system prompt and the question, greedy and bounded.
    (messages, params), = engine.calls
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == DECOMPOSE_SYSTEM
    assert messages[1].content == f"Question: {QUESTION}"
    assert params.temperature == 0.0 and params.max_tokens == DecomposeConfig().max_tokens


def test_weight_zero_and_decompose_false_are_the_plain_search(client: TestClient, service: MemoryService,
                                                               ids: list[str]) -> None:
    plain = _search(client, {"query": QUESTION, "k": 3})
    service.decomposer = QueryDecomposer(RouterEngine("Kai grew up in"))
    service.decompose = True  # the configured default: a request may still say no
    assert _search(client, {"query": QUESTION, "k": 3, "decompose": False}) == plain
    assert "Kai grew up in Portugal near Lisbon" in _search(client, {"query": QUESTION, "k": 2})
    service.retriever.params = service.retriever.params.model_copy(update={"decompose_weight": 0.0})
    assert _search(client, {"query": QUESTION, "k": 3}) == plain


def test_decompose_without_a_router_model_is_a_400_naming_the_field(client: TestClient, ids: list[str]) -> None:
    r = client.post("/v1/memories/search", json={"query": QUESTION, "decompose": True}, headers=A)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == "decompose"
    r = client.post("/v1/memories/search", json={"query": QUESTION, "decompose": "yes"}, headers=A)
    assert r.status_code == 400 and r.json()["error"]["param"] == "decompose"


@pytest.mark.parametrize("reply", [EngineError("model crashed"), "slow"])
def test_a_failed_or_late_model_call_searches_the_question_alone(client: TestClient, service: MemoryService,
                                                                 ids: list[str], reply) -> None:
    plain = _search(client, {"query": QUESTION, "k": 3})
    engine = RouterEngine("Kai grew up in" if reply == "slow" else reply, delay_s=2.0 if reply == "slow" else 0.0)
    service.decomposer = QueryDecomposer(engine, DecomposeConfig(timeout_s=0.2))
    assert _search(client, {"query": QUESTION, "k": 3, "decompose": True}) == plain
    assert len(engine.calls) == 1


def test_the_answer_is_bounded_to_max_queries() -> None:
    engine = RouterEngine("\n".join(f"query {i} about something" for i in range(10)))
    d = asyncio.run(QueryDecomposer(engine, DecomposeConfig(max_queries=3))("What is it?"))
    assert d.queries == ["query 0 about something", "query 1 about something", "query 2 about something"]
    assert d.completion_tokens == 12 and d.model_ms >= 0


def test_parse_subqueries() -> None:
    text = "1) Tom surfing\n- \"Kai's country\"\n\nQuestion: Which country?\nTom surfing\nwhich country is it?\n" + "x" * 300
    assert parse_subqueries(text, "Which country is it?", 5, 40) == ["Tom surfing", "Kai's country", "x" * 40]
    assert parse_subqueries("", "q") == []
    assert parse_subqueries("Query 1: a\nQuery 2: b\nc\nd", "q", 3) == ["a", "b", "c"]


def test_the_cache_answers_without_the_model_and_keys_on_model_and_question(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    engine = RouterEngine("Kai grew up in")
    loads = []

    def load() -> QueryDecomposer:
        loads.append(1)
        return QueryDecomposer(engine)

    first = CachedDecomposer(DecompositionCache(path), "m1", load)
    assert asyncio.run(first("Where is Kai from?")).queries == ["Kai grew up in"]
    assert asyncio.run(first("Where is Kai from?")).queries == ["Kai grew up in"]
    assert (first.hits, first.misses, len(engine.calls), len(loads)) == (1, 1, 1, 1)
    # A later run reads the file: no model load, no call.
    again = CachedDecomposer(DecompositionCache(path), "m1", load)
    assert asyncio.run(again("Where is Kai from?")) == Decomposition(["Kai grew up in"], pytest.approx(0, abs=1e4), 12)
    assert len(loads) == 1
    assert DecompositionCache(path).get("m2", "Where is Kai from?") is None
    assert prompt_key("m1", "a") != prompt_key("m1", "b")
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a decomposition cache"):
        DecompositionCache(path)
