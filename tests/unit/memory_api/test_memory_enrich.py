"""Write-time enrichment through HTTP: a search on a fact's wording returns the record the fact came from.

Memories go in by ``POST /v1/memories``; the enrichment job's per-page code
(``deployments.jobs.enrich.enrich_batch``) runs over the serving hybrid shards (as ``--live`` does
through the deployments); searches go through ``POST /v1/memories/search``. The router model is
:class:`ScriptedEngine` (the LLMEngine test double): the model is not what is tested here, the
prompt it receives, the fact's place in the memory tier and the write's safety are (the real
model's facts are measured by ``recallserve eval locomo --enrich``).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.jobs.enrich import enrich_batch
from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.records import MAX_PARTS, MemoryPart, MemoryRecord
from recallserve.memory_shards.retrieval.when import resolve_relative_dates
from recallserve.memory_shards.shard_access import HybridShardAccess
from recallserve.serve.engine import ChatMessage, EngineError, GenerationParams
from recallserve.serve.enrich import (
    CachedEnricher,
    EnrichConfig,
    EnrichmentCache,
    Exchange,
    FactEnricher,
    facts_of,
    parse_facts,
    with_facts,
)
from recallserve.serve.memory_api import MemoryService

from tests.unit.agent.conftest import ScriptedEngine

from .conftest import auth

A = auth("sk-acme")
MAY_8 = 1683554160.0  # 2023-05-08 13:56 UTC, a Monday

SOURCE = {"text": "Caroline: I went to that group again yesterday, it was so powerful.", "kind": "message",
          "topic": "chat/s1", "created_at": MAY_8, "metadata": {"speaker": "Caroline"}}
OTHER = {"text": "Melanie: The kids and work keep me swamped, support from my husband helps.", "kind": "message",
         "topic": "chat/s1", "created_at": MAY_8 + 60, "metadata": {"speaker": "Melanie"}}
QUERY = "Who attended an LGBTQ support meeting?"
REPLY = "1: Caroline went to an LGBTQ support group meeting yesterday.\n2: Melanie is swamped with kids and work."


def _add(client: TestClient, *memories: dict) -> list[str]:
    r = client.post("/v1/memories", json={"memories": list(memories)}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["ids"]


def _search(client: TestClient, query: str) -> list[dict]:
    r = client.post("/v1/memories/search", json={"query": query, "k": 5, "threshold": 0.0,
                                                  "decay": {"decay": "none"}}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def _enrich(service: MemoryService, engine: ScriptedEngine, *, window: int = 4, dry_run: bool = False) -> dict[str, int]:
    """The job's per-page code over every serving shard, one page each (what ``recallserve job enrich --live`` runs)."""
    enricher = FactEnricher(engine, EnrichConfig(window=window, timeout_s=5))
    emb = HashingEmbedder(384)
    totals: dict[str, int] = {}
    loop = asyncio.new_event_loop()
    try:
        for client in service.coordinator.shards:
            access = HybridShardAccess(client.shard)
            page = access.page(None, 256)
            got = enrich_batch(access, page, dry_run, enricher=enricher, embed=emb.embed, run=loop.run_until_complete,
                               window=window, tenant=None, budget=[100])
            for k, v in got.items():
                totals[k] = totals.get(k, 0) + v
    finally:
        loop.close()
    return totals


def test_a_search_on_a_facts_wording_returns_its_source_record(client: TestClient, service: MemoryService) -> None:
    source, other = _add(client, SOURCE, OTHER)
    # NOTE: "LGBTQ", "meeting" and "attended" are in no stored text and "support" only in the other
    # record: before enrichment the source is not first.
    assert _search(client, QUERY)[0]["id"] == other
    # NOTE: both records of one topic land in a window only when they share a shard: one call per shard's window.
    engine = ScriptedEngine([REPLY, REPLY])
    totals = _enrich(service, engine)
    assert totals["enriched"] >= 1 and totals["conflicts"] == 0
    hits = _search(client, QUERY)
    assert hits[0]["id"] == source
    assert hits[0]["text"] == SOURCE["text"]  # NOTE: the hit is the source record, not the fact
    assert len([h for h in hits if h["id"] == source]) == 1
    # NOTE: the prompt the model received: the exchange, its speaker and the date it was said on.
    user = next(m.content for m in engine.calls[0][0] if m.role == "user")
    assert "Date: 8 May 2023" in user and "Caroline: I went to that group" in user and "Caroline: Caroline:" not in user
    stored = asyncio.run(service.list_by_source("acme", hits[0]["source_id"]))
    assert [f for r in stored for f in facts_of(r)] == [
        "Caroline went to an LGBTQ support group meeting yesterday (7 May 2023)."]


def test_a_record_rewritten_while_the_model_reads_it_keeps_the_users_write(client: TestClient, service: MemoryService) -> None:
    _add(client, {**SOURCE, "source_id": "turn-1"})

    def rewrite_then_answer(messages: Sequence[ChatMessage], params: GenerationParams) -> str:
        _add(client, {**SOURCE, "source_id": "turn-1", "text": "Caroline: correction, I stayed home yesterday."})
        return REPLY

    totals = _enrich(service, ScriptedEngine([rewrite_then_answer]))
    assert totals["conflicts"] == 1 and totals["enriched"] == 0
    stored = asyncio.run(service.list_by_source("acme", "turn-1"))
    assert [r.text for r in stored] == ["Caroline: correction, I stayed home yesterday."]
    assert not facts_of(stored[0])


class _Failing(ScriptedEngine):
    async def chat(self, messages, params):  # type: ignore[no-untyped-def]
        raise EngineError("model crashed")


def test_a_failed_call_writes_nothing_and_a_dry_run_writes_nothing(client: TestClient, service: MemoryService) -> None:
    _add(client, SOURCE)
    assert _enrich(service, _Failing([]))["failed_calls"] == 1
    assert _enrich(service, ScriptedEngine([REPLY]), dry_run=True)["enriched"] == 1
    stored = asyncio.run(service.list_by_source("acme", _search(client, "Caroline group")[0]["source_id"]))
    assert not facts_of(stored[0])


def test_a_failed_call_is_not_cached_so_the_next_run_asks_again(tmp_path: Path) -> None:
    cache = EnrichmentCache(tmp_path / "cache.json")
    engines = iter([_Failing([]), ScriptedEngine([REPLY])])
    for expected_failed in (True, False):
        enricher = CachedEnricher(cache, "m", lambda: FactEnricher(next(engines)))
        got = asyncio.run(enricher(W))
        assert got.failed is expected_failed and enricher.misses == 1
    assert asyncio.run(CachedEnricher(cache, "m", lambda: FactEnricher(_Failing([])))(W)).facts == got.facts  # from the cache


def test_an_enriched_record_is_not_asked_again(client: TestClient, service: MemoryService) -> None:
    _add(client, SOURCE)
    assert _enrich(service, ScriptedEngine([REPLY]))["enriched"] == 1
    assert _enrich(service, ScriptedEngine([]))["asked"] == 0  # NOTE: an empty script fails on any call


# ---- the parts, without HTTP ------------------------------------------------------------------

W = [Exchange("a", "Hi Mel! How are you?", MAY_8, "Caroline"),
     Exchange("b", "I ran a charity race for mental health last Saturday.", MAY_8, "Melanie")]


def test_facts_go_to_the_exchange_they_share_words_with_and_invented_ones_are_dropped() -> None:
    text = ("1: Melanie ran a charity race for mental health last Saturday.\n"  # numbered 1, said in 2
            "2: Ana's sister Eva adopted a puppy named Rex.\n"  # in no exchange: the prompt's example
            "Facts:\n- 2: melanie ran a charity race for mental health last saturday.")
    assert parse_facts(text, W) == [[], ["Melanie ran a charity race for mental health last Saturday (6 May 2023)."]]


def test_parse_bounds_facts_per_exchange_and_chars() -> None:
    text = "\n".join(f"2: Melanie ran race number {i} for charity" for i in range(5))
    got = parse_facts(text, W, max_facts=2, max_chars=40)
    assert [len(f) for f in got] == [0, 2] and all(len(f) <= 40 for f in got[1])


@pytest.mark.parametrize(("said", "expected"), [
    ("We met yesterday.", "We met yesterday (7 May 2023)."),
    ("She ran last Saturday", "She ran last Saturday (6 May 2023)"),
    ("It was two weeks ago", "It was two weeks ago (the week of 24 April 2023)"),
    ("We go camping next month", "We go camping next month (June 2023)"),
    ("Painted it last year", "Painted it last year (2022)"),
    ("last week (1 May)", "last week (1 May)"),
    ("No time here", "No time here"),
])
def test_relative_dates_are_resolved_against_the_time_said(said: str, expected: str) -> None:
    assert resolve_relative_dates(said, MAY_8) == expected


def test_with_facts_keeps_other_parts_and_the_part_bound() -> None:
    rec = MemoryRecord(tenant="t", source_id="s", text="x", parts=[MemoryPart(name="context", text="c"),
                                                                   MemoryPart(name="fact", text="old")])
    got = with_facts(rec, ["f1", "f1", "f2"])
    assert [(p.name, p.text) for p in got.parts] == [("context", "c"), ("fact", "f1"), ("fact", "f2")]
    assert len(with_facts(rec, [f"f{i}" for i in range(40)]).parts) == MAX_PARTS


def test_the_enricher_bounds_its_call_and_a_late_call_gives_no_facts() -> None:
    engine = ScriptedEngine(["2: Melanie ran a charity race."], delay_s=1.0)
    got = asyncio.run(FactEnricher(engine, EnrichConfig(timeout_s=0.05, tokens_per_exchange=30))(W))
    assert got.facts == [[], []] and got.completion_tokens == 0
    assert engine.calls[0][1].max_tokens == 60 and engine.calls[0][1].temperature == 0.0
    with pytest.raises(ValueError, match="window"):
        asyncio.run(FactEnricher(engine, EnrichConfig(window=1))(W))


def test_the_cache_keeps_the_answer_and_parses_it_again(tmp_path) -> None:  # type: ignore[no-untyped-def]
    cache = EnrichmentCache(tmp_path / "c.json")
    got = asyncio.run(FactEnricher(ScriptedEngine(["2: Melanie ran a charity race last Saturday."]))(W))
    cache.put("m", W, got)
    again = EnrichmentCache(tmp_path / "c.json").get("m", W, EnrichConfig(max_fact_chars=32))
    assert again is not None and again.facts == [[], ["Melanie ran a charity race last"]]
    assert EnrichmentCache(tmp_path / "c.json").get("m", W).facts == [[], ["Melanie ran a charity race last Saturday (6 May 2023)."]]
    assert EnrichmentCache(tmp_path / "c.json").get("other-model", W) is None
