"""Query decomposition as ``recallserve eval locomo --decompose`` measures it: the router model's sub-queries are
searched with the question through the memory service and fused; the prompt, bounds and cache.

Not an option of the product's search (no gain by leave-one-out: loadtests/results/locomo-decompose.md), so no
HTTP request can ask for it; the eval calls ``MemoryService.search_request(..., sub_queries=...)``. The engine
here replies from a script (the real router model runs in the eval); the service, retriever, shards, BM25 and
fusion are the real code, and the memories are stored through HTTP.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest
from fastapi.testclient import TestClient
from recallserve.deployments.cli._decompose import (
    DECOMPOSE_SYSTEM,
    CachedDecomposer,
    DecomposeConfig,
    Decomposition,
    DecompositionCache,
    QueryDecomposer,
    parse_subqueries,
    prompt_key,
)
from recallserve.serve.engine import (
    EngineError,
)
from recallserve.serve.memory_api import MemoryService

from tests.unit.agent.conftest import ScriptedEngine

from .conftest import auth

A = auth("sk-acme")


def _router(reply: str | BaseException, delay_s: float = 0.0) -> ScriptedEngine:
    """The router engine: one scripted reply (or the error it raises), recording the prompt it received."""

    def answer(messages, params) -> str:  # type: ignore[no-untyped-def]
        if isinstance(reply, BaseException):
            raise reply
        return reply

    return ScriptedEngine([answer], delay_s=delay_s)


MEMORIES = [
    {"text": "Tom told me his surfing teacher was Kai", "metadata": {"speaker": "Ann"}},
    {"text": "Kai grew up in Portugal near Lisbon", "metadata": {"speaker": "Ann"}},
    {"text": "the weather was nice on Tuesday"},
    {"text": "we had pasta for dinner"},
    {"text": "the printer on floor 3 is out of toner"},
]
QUESTION = "Which country is Tom's surfing teacher from?"


def _search(service: MemoryService, decomposer: QueryDecomposer | None = None, k: int = 2,
            weight: float = 1.0) -> list[str]:
    """The texts the eval's search ranks for QUESTION: with ``decomposer``, its sub-queries fused in."""
    from recallserve.serve.memory_api import SearchRequest

    async def go() -> list[str]:
        subs = (await decomposer(QUESTION)).queries if decomposer is not None else []
        req = SearchRequest(query=QUESTION, k=k, threshold=0.0, decay={"decay": "none"})
        return [h.record.text for h in await service.search_request("acme", req, sub_queries=subs, sub_query_weight=weight)]

    return asyncio.run(go())


@pytest.fixture
def ids(client: TestClient) -> list[str]:
    r = client.post("/v1/memories", json={"memories": MEMORIES}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["ids"]


def test_a_sub_query_brings_in_the_second_hop(service: MemoryService, ids: list[str]) -> None:
    engine = _router("1. Tom's surfing teacher\n2. Kai grew up in\n3. home country")
    assert "Kai grew up in Portugal near Lisbon" not in _search(service)
    decomposed = _search(service, QueryDecomposer(engine))
    assert decomposed[0] == "Tom told me his surfing teacher was Kai"
    assert "Kai grew up in Portugal near Lisbon" in decomposed
    # The prompt the router received: the fixed system prompt and the question, greedy and bounded.
    (messages, params), = engine.calls
    assert [m.role for m in messages] == ["system", "user"]
    assert messages[0].content == DECOMPOSE_SYSTEM
    assert messages[1].content == f"Question: {QUESTION}"
    assert params.temperature == 0.0 and params.max_tokens == DecomposeConfig().max_tokens


def test_weight_zero_is_the_plain_search(service: MemoryService, ids: list[str]) -> None:
    plain = _search(service, k=3)
    assert _search(service, QueryDecomposer(_router("Kai grew up in")), k=3, weight=0.0) == plain
    assert _search(service, QueryDecomposer(_router("Kai grew up in")), k=3) != plain


def test_no_http_search_takes_a_decomposition(client: TestClient, ids: list[str]) -> None:
    r = client.post("/v1/memories/search", json={"query": QUESTION, "decompose": True}, headers=A)
    assert r.status_code == 400 and "decompose" in r.text


@pytest.mark.parametrize("reply", [EngineError("model crashed"), "slow"])
def test_a_failed_or_late_model_call_searches_the_question_alone(service: MemoryService, ids: list[str], reply) -> None:
    plain = _search(service, k=3)
    engine = _router("Kai grew up in" if reply == "slow" else reply, delay_s=2.0 if reply == "slow" else 0.0)
    assert _search(service, QueryDecomposer(engine, DecomposeConfig(timeout_s=0.2)), k=3) == plain
    assert len(engine.calls) == 1


def test_the_answer_is_bounded_to_max_queries() -> None:
    engine_text = "\n".join(f"query {i} about something" for i in range(10))
    engine = _router(engine_text)
    d = asyncio.run(QueryDecomposer(engine, DecomposeConfig(max_queries=3))("What is it?"))
    assert d.queries == ["query 0 about something", "query 1 about something", "query 2 about something"]
    assert d.completion_tokens == len(engine_text) // 4 and d.model_ms >= 0


def test_parse_subqueries() -> None:
    text = "1) Tom surfing\n- \"Kai's country\"\n\nQuestion: Which country?\nTom surfing\nwhich country is it?\n" + "x" * 300
    assert parse_subqueries(text, "Which country is it?", 5, 40) == ["Tom surfing", "Kai's country", "x" * 40]
    assert parse_subqueries("", "q") == []
    assert parse_subqueries("Query 1: a\nQuery 2: b\nc\nd", "q", 3) == ["a", "b", "c"]


def test_the_cache_answers_without_the_model_and_keys_on_model_and_question(tmp_path: Path) -> None:
    path = tmp_path / "d.json"
    engine = _router("Kai grew up in")
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
    assert asyncio.run(again("Where is Kai from?")) == Decomposition(["Kai grew up in"], pytest.approx(0, abs=1e4), len("Kai grew up in") // 4)
    assert len(loads) == 1
    assert DecompositionCache(path).get("m2", "Where is Kai from?") is None
    assert prompt_key("m1", "a") != prompt_key("m1", "b")
    path.write_text("[1, 2]")
    with pytest.raises(ValueError, match="not a decomposition cache"):
        DecompositionCache(path)
