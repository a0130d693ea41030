"""``recallserve job enrich`` on shard folders: facts written as parts, checkpoint and resume, bounds.

The fast tests use :class:`ScriptedEngine` (the LLMEngine test double) because the job's loop is
what they test; the slow one runs the real router model (llama.cpp) on a handful of records.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from recallserve.deployments.jobs import JobOptions
from recallserve.deployments.jobs.enrich import enrich
from recallserve.memory_shards import HashingEmbedder, MemoryRecord, MemoryShard, ShardConfig, embed_records
from recallserve.memory_shards.shard_access import all_records
from recallserve.serve.enrich import EnrichConfig, FactEnricher, facts_of

from tests.unit.agent.conftest import ScriptedEngine

EMB = HashingEmbedder(384)
MAY_8 = 1683554160.0

TEXTS = ["Caroline: I went to an LGBTQ support group yesterday, it was so powerful.",
         "Melanie: I painted a lake sunrise last year, it is my favourite.",
         "Caroline: I'm keen on counseling or working in mental health.",
         "Melanie: Thanks!"]


def _store(root: Path) -> None:
    shard = MemoryShard(ShardConfig(shard_id=0, data_dir=str(root / "shard-0"), model_id=EMB.model_id, dim=EMB.dim))
    try:
        shard.upsert(embed_records(EMB, [
            MemoryRecord(tenant="t1", source_id=f"turn-{i}", kind="message", text=t, created_at=MAY_8 + i,
                         topic_path="chat/s1") for i, t in enumerate(TEXTS)]
            + [MemoryRecord(tenant="t2", source_id="x", kind="message", text="Tom: I sold my bike last week.", created_at=MAY_8)]))
    finally:
        shard.close()


def _facts(root: Path) -> dict[str, list[str]]:
    shard = MemoryShard(ShardConfig(shard_id=0, data_dir=str(root / "shard-0"), model_id=EMB.model_id, dim=EMB.dim))
    try:
        return {r.source_id: facts_of(r) for r in all_records(shard)}
    finally:
        shard.close()


def _opts(root: Path, **kw) -> JobOptions:  # type: ignore[no-untyped-def]
    return JobOptions(data_dir=root, model_id=EMB.model_id, dim=EMB.dim, progress=False, **kw)


def test_the_job_writes_facts_for_one_tenant_checkpoints_and_skips_done_records(tmp_path: Path) -> None:
    _store(tmp_path)
    reply = ("1: Caroline went to an LGBTQ support group yesterday.\n2: Melanie painted a lake sunrise last year.\n"
             "3: Caroline is keen on counseling.")
    engine = ScriptedEngine([reply])
    report = enrich(_opts(tmp_path), tenant="t1", enricher=FactEnricher(engine, EnrichConfig()), embed=EMB.embed)
    assert report.stats["asked"] == 4 and report.stats["enriched"] == 3 and report.stats["facts"] == 3
    facts = _facts(tmp_path)
    assert facts["turn-0"] == ["Caroline went to an LGBTQ support group yesterday (7 May 2023)."]
    assert facts["turn-1"] == ["Melanie painted a lake sunrise last year (2022)."]
    assert facts["turn-3"] == [] and facts["x"] == []  # nothing said / another tenant
    assert (tmp_path / ".jobs" / "enrich.json").exists()
    # NOTE: a rerun from scratch asks only the records still without facts (one window, turn-3).
    again = enrich(_opts(tmp_path, restart=True), tenant="t1", enricher=FactEnricher(ScriptedEngine([""])), embed=EMB.embed)
    assert again.stats["asked"] == 1 and again.stats["enriched"] == 0


def test_the_job_bounds_the_records_asked_and_rejects_bad_bounds(tmp_path: Path) -> None:
    _store(tmp_path)
    engine = ScriptedEngine(["1: Caroline went to a support group yesterday."] * 3)
    report = enrich(_opts(tmp_path), window=1, max_records=2, enricher=FactEnricher(engine, EnrichConfig(window=1)),
                    embed=EMB.embed)
    assert report.stats["asked"] == 2 and len(engine.calls) == 2
    # a window wider than what is left of the bound is cut to it
    engine = ScriptedEngine(["1: Caroline went to a support group yesterday."])
    report = enrich(_opts(tmp_path, restart=True), window=4, max_records=1,
                    enricher=FactEnricher(engine, EnrichConfig(window=4)), embed=EMB.embed)
    assert report.stats["asked"] == 1
    with pytest.raises(ValueError, match="window"):
        enrich(_opts(tmp_path), window=9, embed=EMB.embed, enricher=FactEnricher(engine))
    with pytest.raises(ValueError, match="max_records"):
        enrich(_opts(tmp_path), max_records=0, embed=EMB.embed, enricher=FactEnricher(engine))


@pytest.mark.slow
def test_the_job_with_the_real_router_model_on_a_handful_of_records(tmp_path: Path) -> None:
    _store(tmp_path)
    report = enrich(_opts(tmp_path), tenant="t1", threads=2, timeout_s=120, embed=EMB.embed)
    assert report.stats["asked"] == 4 and report.stats["failed_calls"] == 0
    facts = _facts(tmp_path)
    # NOTE: the model's wording varies with the machine (llama.cpp's float paths differ between CPUs:
    # one keeps "yesterday", another writes "Caroline attended an LGBTQ support group."); the code's part
    # does not: the support group turn gets a fact naming Caroline, and a relative day the model kept is
    # resolved to the day before the turn was said (the resolution itself: the scripted test above).
    assert any("Caroline" in f and "support group" in f.lower() for f in facts["turn-0"]), facts
    kept = [f for f in facts["turn-0"] if "yesterday" in f.lower()]
    assert all("(7 May 2023)" in f for f in kept), facts
