"""The experience service: tiers, retrieval, tenancy, expiry, decay, conflicts, review, restart."""

from __future__ import annotations

import asyncio
import json
from collections.abc import Sequence

import pytest
from prometheus_client import REGISTRY

from recallserve.serve.engine import ChatMessage, ChatResult, GenerationParams
from recallserve.serve.experience import (
    ExperienceNotFound,
    ExperienceRecord,
    LabelRequest,
    Rule,
    SearchRequest,
)
from recallserve.serve.experience import _metrics

from ._records import speed_record
from .conftest import bag_of_words_embed

QWEN = "Qwen2.5-Coder-1.5B-Instruct"
run = asyncio.run


_now = {"clock": None}


@pytest.fixture(autouse=True)
def _bind_clock(clock):
    _now["clock"] = clock


def rec(**kw) -> ExperienceRecord:
    """A record stamped with the test clock's time (records are created 'now')."""
    kw.setdefault("timestamp", _now["clock"].t)
    return ExperienceRecord.model_validate(speed_record(**kw))


def search(svc, tenant="acme", query="car drives km speed", model=QWEN, **kw):
    return run(svc.search(tenant, SearchRequest(query=query, source_model=model, **kw)))


def test_create_verifies_and_files_by_confidence(make_service):
    svc = make_service()
    good = run(svc.create("acme", rec()))
    assert good.tier == "active" and good.record.outcome.confidence == "high"
    assert [v.status for v in good.record.verification if v.input.get("source") != "context"] == ["pass", "pass"]
    assert good.record.evaluation.error_tags == []
    bad = run(svc.create("acme", rec(answer="95 km/h")))
    assert bad.tier == "review" and bad.record.outcome.confidence == "low"
    assert bad.record.verification[0].actual == 80.0
    assert bad.record.evaluation.error_tags == ["arithmetic_error"]  # the failed recomputation
    flagged = run(svc.create("acme", rec(label="wrong")))
    assert flagged.tier == "review"


def test_tenants_and_model_families_are_isolated(make_service):
    svc = make_service()
    created = run(svc.create("acme", rec()))
    assert [h.experience.record.metadata.id for h in search(svc).hits] == [created.record.metadata.id]
    assert search(svc, tenant="other").hits == []
    with pytest.raises(ExperienceNotFound):
        run(svc.get("other", created.record.metadata.id))
    assert search(svc, model="llama-3.1-8b-instruct").hits == []
    # Same family, other size: another model, not reused (002) ...
    assert search(svc, model="qwen2.5-coder-0.5b-instruct-q4_k_m").hits == []
    # ... unless configuration names the family.
    shared = make_service(shared_families=["qwen2.5-coder"])
    assert len(search(shared, model="qwen2.5-coder-0.5b-instruct-q4_k_m").hits) == 1
    assert search(svc, domain="finance").hits == []


def test_search_touches_and_scores(make_service, clock):
    svc = make_service()
    a = run(svc.create("acme", rec(text="A car drives 120 km in 1.5 h. Speed?")))
    clock.advance(1)
    run(svc.create("acme", rec(text="Unrelated words about cooking pasta with sauce and salt")))
    clock.advance(1)
    query = "A car drives 120 km in 1.5 h. Speed?"
    hits = search(svc, query=query, k=1).hits
    assert hits[0].experience.record.metadata.id == a.record.metadata.id
    expected = float(bag_of_words_embed([a.record.search_text()])[0] @ bag_of_words_embed([query])[0])
    assert hits[0].similarity == pytest.approx(expected, abs=1e-5) and expected > 0.8
    again = run(svc.get("acme", a.record.metadata.id))
    assert again.use_count == 1 and again.last_used_at == clock.t and again.decay == 1.0
    assert again.record.evaluation.retrieval_score == pytest.approx(hits[0].score)


def test_restart_keeps_records(make_service):
    svc = make_service()
    created = run(svc.create("acme", rec()))
    svc.close()
    svc2 = make_service()
    got = run(svc2.get("acme", created.record.metadata.id))
    assert got.record == created.record and got.tier == "active"
    assert len(search(svc2).hits) == 1


def test_hard_expiry(make_service, clock):
    svc = make_service(default_ttl_days=5)
    keep = run(svc.create("acme", rec(expires_at=clock.t + 100 * 86400)))
    gone = run(svc.create("acme", rec()))
    assert gone.record.metadata.expires_at == pytest.approx(clock.t + 5 * 86400)
    clock.advance(6)
    # 002: expiry moves a record out of the active cache; it is not deleted.
    assert [h.experience.record.metadata.id for h in search(svc).hits] == [keep.record.metadata.id]
    report = run(svc.maintain())
    assert report.expired_archived == 1
    assert run(svc.get("acme", gone.record.metadata.id)).tier == "archival"
    assert run(svc.get("acme", keep.record.metadata.id)).tier == "active"


def test_soft_decay_demotes_to_archival(make_service, clock):
    svc = make_service()
    created = run(svc.create("acme", rec()))
    clock.advance(20)
    assert len(search(svc).hits) == 1  # decay 1/3 > 0.3, and the search refreshes last use
    clock.advance(24)
    assert search(svc).hits == []
    assert run(svc.get("acme", created.record.metadata.id)).tier == "archival"
    arch = search(svc, topic_prefix="physics", archival_k=5).archival
    assert [h.experience.record.metadata.id for h in arch] == [created.record.metadata.id]


def test_capacity_demotes_least_recently_used(make_service, clock):
    svc = make_service(active_capacity=50)
    ids = []
    for i in range(52):
        ids.append(run(svc.create("acme", rec(text=f"problem number {i}: a car drives 120 km in 1.5 h. What is its speed?"))).record.metadata.id)
        clock.t += 1
    tiers = {i: run(svc.get("acme", i)).tier for i in ids}
    assert [i for i in ids if tiers[i] == "archival"] == ids[:2]
    assert sum(t == "active" for t in tiers.values()) == 50


def test_conflict_prefers_newer_archival_record(make_service, clock):
    svc = make_service()
    old = run(svc.create("acme", rec()))
    clock.advance(1)
    newer = run(svc.create("acme", rec(text="A truck drives 120 km in 1.5 h. Speed?")))
    # Simulate the newer record having been demoted (e.g. by capacity) while the old stays active.
    run(svc.store.set_tier("acme", [newer.record.metadata.id], "archival"))
    result = search(svc, k=3)
    assert [c.active_id for c in result.conflicts] == [old.record.metadata.id]
    assert result.conflicts[0].newer_id == newer.record.metadata.id
    assert [(h.experience.record.metadata.id, h.preferred_over) for h in result.hits] == [
        (newer.record.metadata.id, old.record.metadata.id)]
    before = REGISTRY.get_sample_value("recallserve_experience_conflicts_total")
    search(svc, k=3)
    assert REGISTRY.get_sample_value("recallserve_experience_conflicts_total") == before + 1


def test_review_then_label_moves_records(make_service, clock):
    svc = make_service()
    low = run(svc.create("acme", rec(answer="95 km/h")))
    clock.t += 1
    low2 = run(svc.create("acme", rec(answer="70 km/h")))
    queue = run(svc.review_queue("acme"))
    assert [v.record.metadata.id for v in queue] == [low.record.metadata.id, low2.record.metadata.id]
    assert run(svc.review_queue("other")) == []
    out = run(svc.label("acme", low.record.metadata.id,
                        LabelRequest(label="wrong", error_tags=["Unit Error"], note="used mph", reviewer="ann")))
    # NOTE: the reviewer's tags first, then those the verifier derived from the failed check.
    assert out.tier == "archival" and out.record.evaluation.error_tags == ["unit_error", "arithmetic_error"]
    assert out.record.metadata.reviewer == "ann" and out.record.evaluation.review_note == "used mph"
    ok = run(svc.label("acme", low2.record.metadata.id, LabelRequest(label="correct")))
    assert ok.tier == "active" and ok.record.metadata.reviewer == "acme"
    assert run(svc.review_queue("acme")) == []
    by_tag = search(svc, archival_k=5, error_tags=["unit_error"]).archival
    assert [h.experience.record.metadata.id for h in by_tag] == [low.record.metadata.id]
    assert search(svc, archival_k=5, error_tags=["other_tag"]).archival == []


def test_metrics_track_rates(make_service):
    svc = make_service(extracted_checks=False)  # NOTE: counts the records' own checks only
    before = _metrics.snapshot()
    run(svc.create("acme", rec()))  # 2 pass
    run(svc.create("acme", rec(answer="95 km/h")))  # recomputation fails, unit check passes
    search(svc)  # hit
    search(svc, tenant="nobody")  # miss
    after = _metrics.snapshot()
    assert after["verification_items"] - before["verification_items"] == 4
    assert after["lookups"] - before["lookups"] == 2
    assert REGISTRY.get_sample_value("recallserve_experience_verification_pass_rate") == after["verification_pass_rate"]
    assert REGISTRY.get_sample_value("recallserve_experience_cache_hit_rate") == after["cache_hit_rate"]
    assert REGISTRY.get_sample_value("recallserve_experience_active_cache_freshness") == pytest.approx(1.0)


class ScriptedEngine:
    """Test double of LLMEngine: returns canned replies and records the prompts it got."""

    model_name = "qwen2.5-coder-1.5b-instruct-q4_k_m"
    context_window = 4096

    def __init__(self, replies: Sequence[str]) -> None:
        self.replies = list(replies)
        self.prompts: list[list[ChatMessage]] = []

    async def chat(self, messages, params: GenerationParams) -> ChatResult:
        self.prompts.append(list(messages))
        return ChatResult(text=self.replies.pop(0), prompt_tokens=10, completion_tokens=5, finish_reason="stop",
                          model=self.model_name)


class RecordingMemory:
    """Test double of MemoryBackend that keeps writes."""

    def __init__(self) -> None:
        self.writes = []

    async def write(self, tenant, items):
        self.writes.extend((tenant, i) for i in items)
        return [str(n) for n in range(len(items))]

    async def search(self, *a, **k):
        return []


REPLY = json.dumps({
    "context": {"facts": ["120 km in 1.5 h"], "quantities": [{"name": "d", "value": 120, "unit": "km"}]},
    "reasoning": [{"step_id": 1, "text": "120 / 1.5 = 80", "principle": "v = d / t"}],
    "verification": [{"type": "recomputation", "target": "120 / 1.5", "expected": 80},
                     {"type": "unit_check", "target": "120 km / 1.5 h", "expected": "km/h"}],
    "outcome": {"answer": "80 km/h", "confidence": "high"},
})
REPLY_NO_UNIT_CHECK = json.dumps({
    "context": {"facts": ["90 km in 1.5 h"]}, "reasoning": ["90 / 1.5 = 60"],
    "verification": [{"type": "recomputation", "target": "90 / 1.5", "expected": 60}],
    "outcome": {"answer": "60 km/h", "confidence": "high"},
})


def test_produce_stores_and_injects_with_required_checks(tmp_path, clock):
    from recallserve.serve.experience import ExperienceConfig, ExperienceService

    memory = RecordingMemory()
    svc = ExperienceService(
        ExperienceConfig(data_dir=tmp_path, min_similarity=0.1,
                         rules=[Rule(id="OT-1", description="overtime", expression="1", domain="units")]),
        embed=bag_of_words_embed, memory=memory, clock=clock)
    engine = ScriptedEngine([REPLY, REPLY_NO_UNIT_CHECK, "no idea"])
    first = run(svc.produce("acme", engine, "A car drives 120 km in 1.5 h. Speed?", domain="units",
                            topic="physics/speed"))
    assert first.answer == "80 km/h" and first.report.ok and first.injected == []
    assert first.experience is not None and first.experience.record.outcome.confidence == "high"
    assert "OT-1: overtime" in engine.prompts[0][1].content
    assert sorted(i.source_id for _, i in memory.writes) == sorted(
        f"experience:{first.experience.record.metadata.id}:{s}"
        for s in ("context", "reasoning", "verification", "outcome"))
    second = run(svc.produce("acme", engine, "A car drives 90 km in 1.5 h. Speed?", domain="units",
                             topic="physics/speed"))
    prompt = engine.prompts[1][1].content
    assert "Past solved problems" in prompt and "v = d / t" in prompt
    assert "must include: recomputation, unit_check" in prompt
    assert second.injected == [first.experience.record.metadata.id]
    assert [(v.type, v.status) for v in second.experience.record.verification if v.input.get("source") != "context"] == [
        ("recomputation", "pass"), ("unit_check", "doubtful")]
    assert second.experience.record.outcome.confidence == "medium"
    third = run(svc.produce("acme", engine, "Speed?", inject=False))
    assert third.answer is None and not third.report.ok and third.first_report is None  # no rewriter here
    assert third.experience is not None and third.experience.tier == "review"
    assert third.experience.record.evaluation.error_tags == ["unparsed"]
    svc.close()
