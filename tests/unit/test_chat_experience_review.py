"""Review before reuse, seen where it matters: the prompt of a later chat turn.

A scripted engine stands in for the reasoner (its replies are fixed segmented traces; what is
asserted is what the pipeline stores and what it injects into the next prompt). A trace whose
checks do not all pass waits in review and is never injected; once a reviewer labels it correct
through the HTTP API, the next turn's prompt carries it. A trace verified with high confidence is
reused without review.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.memory_shards import HashingEmbedder
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.experience import ExperienceConfig, ExperienceService, build_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from tests.unit.agent.conftest import ScriptedEngine

KEYS = {"sk-acme": "acme"}
H = {"Authorization": "Bearer sk-acme"}
# NOTE: the boundary test states no bounds, so code marks it doubtful: confidence medium.
UNVERIFIED = """Context: 120 km in 1.5 h
Reasoning:
1. speed = 120 / 1.5 = 80 [principle: speed is distance over time]
Verification:
- boundary_test: 80
Outcome: 80 km/h
Confidence: high"""
VERIFIED = """Context: 120 km in 1.5 h
Reasoning:
1. speed = 120 / 1.5 = 80 [principle: speed is distance over time]
Verification:
- recomputation: 120 / 1.5 = 80
- unit_check: 120 km / 1.5 h -> km/h
Outcome: 80 km/h
Confidence: high"""
Q1 = "A car drives 120 km in 1.5 h. What is its speed?"
Q2 = "A car drives 90 km in 1.5 h. What is its speed?"


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[TestClient, ScriptedEngine]]:
    emb = HashingEmbedder(384)
    engine = ScriptedEngine([])
    # NOTE: audit_share 0 so the sampled audit (a hash of the random id) cannot change the tier here.
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", min_similarity=0.1, audit_share=0.0),
                                    emb.embed)
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), experiences=experiences)
    auth = Authenticator(KEYS)
    with TestClient(create_app(pipeline, auth, routers=[build_router(experiences, auth)])) as c:
        yield c, engine
    experiences.close()


def _turn(c: TestClient, engine: ScriptedEngine, question: str, reply: str) -> tuple[dict[str, Any], str]:
    engine.replies.append(reply)
    n = len(engine.calls)
    r = c.post("/v1/chat/completions", headers=H, json={
        "model": "recallserve", "max_tokens": 96, "messages": [{"role": "user", "content": question}],
        "metadata": {"reasoning": "segmented", "task_domain": "units", "topic": "physics/speed"}})
    assert r.status_code == 200, r.text
    assert len(engine.calls) == n + 1
    prompt = "\n".join(m.content for m in engine.calls[-1][0])
    return r.json()["recallserve"]["experience"], prompt


def test_unverified_trace_waits_in_review_until_labelled_correct(rig: Any) -> None:
    c, engine = rig
    first, _ = _turn(c, engine, Q1, UNVERIFIED)
    assert first["confidence"] == "medium" and first["tier"] == "review"
    assert [q["record"]["metadata"]["id"] for q in c.get("/v1/experiences/review", headers=H).json()] == [first["id"]]
    second, prompt = _turn(c, engine, Q2, UNVERIFIED)
    assert second["injected"] == [] and "Past solved problems" not in prompt
    r = c.post(f"/v1/experiences/{first['id']}/label", headers=H, json={"label": "correct"})
    assert r.status_code == 200 and r.json()["tier"] == "active"
    third, prompt = _turn(c, engine, Q2, VERIFIED)
    assert third["injected"] == [first["id"]]
    assert "Past solved problems" in prompt and "speed is distance over time" in prompt


def test_verified_high_confidence_trace_is_reused_without_review(rig: Any) -> None:
    c, engine = rig
    first, _ = _turn(c, engine, Q1, VERIFIED)
    assert first["confidence"] == "high" and first["tier"] == "active"
    assert c.get("/v1/experiences/review", headers=H).json() == []
    second, prompt = _turn(c, engine, Q2, VERIFIED)
    assert second["injected"] == [first["id"]] and "Past solved problems" in prompt


WRONG = """Context: 120 km in 1.5 h
Reasoning:
1. speed = 120 / 1.5 = 90 [principle: speed is distance over time]
Verification:
- recomputation: 120 / 1.5 = 90
Outcome: 90 km/h
Confidence: high"""


def _noise(c: TestClient, text: str) -> str:
    """An archival lesson of the same topic without the arithmetic tag (labelled wrong for another reason)."""
    rec = {"metadata": {"source_model": "scripted", "task_domain": "units", "topic": "physics/speed"},
           "context": {"raw_text": text}, "reasoning": [{"step_id": 1, "text": "read the question", "principle": "p"}],
           "verification": [{"type": "recomputation", "target": "90 / 1.5", "expected": 60}],
           "outcome": {"answer": "60 km/h"}}
    exp_id = c.post("/v1/experiences", headers=H, json=rec).json()["record"]["metadata"]["id"]
    r = c.post(f"/v1/experiences/{exp_id}/label", headers=H, json={"label": "wrong", "error_tags": ["misread_question"]})
    assert r.json()["tier"] == "archival" and r.json()["record"]["evaluation"]["error_tags"] == ["misread_question"]
    return exp_id


def test_failed_checks_become_error_tags_that_pick_the_next_prompts_lessons(rig: Any) -> None:
    c, engine = rig
    first, _ = _turn(c, engine, Q1, WRONG)
    assert first["confidence"] == "low" and first["tier"] == "review"
    stored = c.get(f"/v1/experiences/{first['id']}", headers=H).json()["record"]
    assert stored["evaluation"]["error_tags"] == ["arithmetic_error"]
    r = c.post(f"/v1/experiences/{first['id']}/label", headers=H, json={"label": "wrong", "note": "120/1.5 is 80"})
    assert r.json()["tier"] == "archival" and r.json()["record"]["evaluation"]["error_tags"] == ["arithmetic_error"]
    # Two lessons of the topic closer to the next question than the tagged one, but on another mistake.
    noise = [_noise(c, Q2), _noise(c, Q2 + " Give km/h.")]
    by_topic = c.post("/v1/experiences/search", headers=H, json={
        "query": Q2, "source_model": "scripted", "topic_prefix": "physics/speed", "archival_k": 2}).json()["archival"]
    assert sorted(h["experience"]["record"]["metadata"]["id"] for h in by_topic) == sorted(noise)
    second, prompt = _turn(c, engine, Q2, VERIFIED)
    assert {"arithmetic_error", "unit_mismatch"} <= set(second["searched_tags"])  # Q2 states numbers with units
    assert len(second["archival"]) == 2 and second["archival"][0] == first["id"]
    assert "Avoid (arithmetic_error)" in prompt and "120/1.5 is 80" in prompt
    assert prompt.count("- Avoid (") == 2  # at most 2 archival lessons


def test_listed_domains_reason_segmented_without_a_request_flag(tmp_path: Path) -> None:
    emb = HashingEmbedder(384)
    engine = ScriptedEngine([VERIFIED, "Plain answer.", "Plain answer."])
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", domains=["units"], audit_share=0.0),
                                    emb.embed)
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), experiences=experiences)
    auth = Authenticator(KEYS)

    def ask(meta: dict[str, str]) -> dict[str, Any]:
        r = c.post("/v1/chat/completions", headers=H, json={
            "model": "recallserve", "max_tokens": 96, "messages": [{"role": "user", "content": Q1}], "metadata": meta})
        assert r.status_code == 200, r.text
        return r.json()

    with TestClient(create_app(pipeline, auth, routers=[build_router(experiences, auth)])) as c:
        listed = ask({"task_domain": "units", "topic": "physics/speed"})
        assert listed["recallserve"]["experience"]["tier"] == "active"
        assert engine.calls[0][0][0].content.startswith("Solve the problem")  # the segmented format's prompt
        other = ask({"task_domain": "chat"})
        opted_out = ask({"task_domain": "units", "reasoning": "default"})
        for body, n in ((other, 1), (opted_out, 2)):
            assert "experience" not in body["recallserve"]
            assert not engine.calls[n][0][0].content.startswith("Solve the problem")
    experiences.close()


@pytest.mark.parametrize("rewrite_ok", [True, False])
def test_unparsable_reply_is_rewritten_once_by_the_router_else_kept_for_review(tmp_path: Path, rewrite_ok: bool) -> None:
    emb = HashingEmbedder(384)
    engine = ScriptedEngine(["The speed is eighty, I think, since 120 over 1.5 is 80."])
    router = ScriptedEngine([VERIFIED if rewrite_ok else "Sorry, I cannot."])
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", audit_share=0.0), emb.embed,
                                    rewriter=router)
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), experiences=experiences)
    auth = Authenticator(KEYS)
    with TestClient(create_app(pipeline, auth, routers=[build_router(experiences, auth)])) as c:
        r = c.post("/v1/chat/completions", headers=H, json={
            "model": "recallserve", "max_tokens": 96, "messages": [{"role": "user", "content": Q1}],
            "metadata": {"reasoning": "segmented", "task_domain": "units"}})
        assert r.status_code == 200, r.text
        meta = r.json()["recallserve"]["experience"]
        assert len(router.calls) == 1 and "120 over 1.5 is 80" in router.calls[0][0][-1].content
        assert meta["rewritten"] is True and meta["parsed"] is rewrite_ok
        stored = c.get(f"/v1/experiences/{meta['id']}", headers=H).json()
        if rewrite_ok:
            assert stored["tier"] == "active" and stored["record"]["outcome"]["answer"] == "80 km/h"
        else:
            assert stored["tier"] == "review" and stored["record"]["evaluation"]["error_tags"] == ["unparsed"]
            assert "120 over 1.5 is 80" in stored["record"]["outcome"]["explanation"]
            assert [q["record"]["metadata"]["id"] for q in c.get("/v1/experiences/review", headers=H).json()] == [
                meta["id"]]
    experiences.close()


# Issue 19: the a1 trace of the eval run (E-CoT on), "17 / 17 = 1" for 17 pens at 3 each. Every
# check agrees with the formula, which leaves out the price: it must wait in review, not be reused.
A1 = "Pens cost 3 each. How much do 17 pens cost?"
A1_WRONG = """Context: 3 pens cost 17

Reasoning:
1. cost per pen = 17 / 17 = 1 [principle: cost per item = total cost / number of items]
Verification:
- recomputation: 17 / 17 = 1
- boundary_test: 1 in [0, 17]

Outcome: 1

Confidence: high"""
A1_RIGHT = """Context: 17 pens at 3 each
Reasoning:
1. cost = 17 * 3 = 51 [principle: total cost = count * price]
Verification:
- recomputation: 17 * 3 = 51
- boundary_test: 51 in [17, 100]
Outcome: 51
Confidence: high"""


def _posted(c: TestClient, question: str, reply: str) -> dict[str, Any]:
    from recallserve.serve.experience import ExperienceMetadata
    from recallserve.serve.experience._parser import parse_segmented

    rec = parse_segmented(reply).to_record(question, ExperienceMetadata(source_model="scripted", task_domain="arithmetic",
                                                                        topic="math/arithmetic"))
    r = c.post("/v1/experiences", headers=H, json=rec.model_dump(mode="json"))
    assert r.status_code == 201, r.text
    return r.json()


def _active_ids(c: TestClient, query: str) -> list[str]:
    r = c.post("/v1/experiences/search", headers=H, json={"query": query, "source_model": "scripted"})
    assert r.status_code == 200, r.text
    return [h["experience"]["record"]["metadata"]["id"] for h in r.json()["hits"]]


def test_a_posted_trace_that_ignores_a_stated_quantity_waits_in_review(rig: Any) -> None:
    c, _ = rig
    wrong = _posted(c, A1, A1_WRONG)
    wrong_id = wrong["record"]["metadata"]["id"]
    assert wrong["tier"] == "review" and wrong["record"]["outcome"]["confidence"] == "medium"
    assert wrong["record"]["evaluation"]["error_tags"] == ["ungrounded_quantity"]
    grounding = [v for v in wrong["record"]["verification"] if v["type"] == "grounding_check"]
    assert [(v["status"], v["actual"]) for v in grounding] == [("doubtful", [3.0])]
    assert [q["record"]["metadata"]["id"] for q in c.get("/v1/experiences/review", headers=H).json()] == [wrong_id]
    assert wrong_id not in _active_ids(c, A1)
    right = _posted(c, A1, A1_RIGHT)
    assert right["tier"] == "active" and right["record"]["outcome"]["confidence"] == "high"
    assert right["record"]["evaluation"]["error_tags"] == []
    assert _active_ids(c, A1) == [right["record"]["metadata"]["id"]]
    assert [q["record"]["metadata"]["id"] for q in c.get("/v1/experiences/review", headers=H).json()] == [wrong_id]


def test_a_posted_trace_whose_checks_never_compute_the_answer_waits_in_review(rig: Any) -> None:
    c, _ = rig
    rec = {"metadata": {"source_model": "scripted", "task_domain": "arithmetic", "topic": "math/arithmetic"},
           "context": {"raw_text": "A box holds 12 bottles. How many bottles are in 7 boxes?"},
           "reasoning": [{"step_id": 1, "text": "bottles per box = 12"}],
           "verification": [{"type": "recomputation", "target": "12 * 1", "expected": 12},
                            {"type": "boundary_test", "target": "84", "input": {"min": 12, "max": 1000}}],
           "outcome": {"answer": "84"}}
    r = c.post("/v1/experiences", headers=H, json=rec)
    assert r.status_code == 201, r.text
    body = r.json()
    assert {v["status"] for v in body["record"]["verification"]} == {"pass"}  # every check passes ...
    assert body["tier"] == "review" and body["record"]["outcome"]["confidence"] == "medium"  # ... none gives 84
    assert body["record"]["evaluation"]["error_tags"] == ["answer_not_computed"]
    rec["verification"] = [{"type": "recomputation", "target": "12 * 7", "expected": 84}]
    rec["metadata"]["id"] = "exp_fixed"
    fixed = c.post("/v1/experiences", headers=H, json=rec).json()
    assert fixed["tier"] == "active", fixed


def test_the_a1_chat_turn_is_kept_from_the_next_prompt(rig: Any) -> None:
    c, engine = rig
    first, _ = _turn(c, engine, A1, A1_WRONG)
    stored = c.get(f"/v1/experiences/{first['id']}", headers=H).json()
    assert first["tier"] == stored["tier"] == "review" and stored["record"]["evaluation"]["error_tags"] == [
        "ungrounded_quantity"]
    second, prompt = _turn(c, engine, "Pens cost 3 each. How much do 12 pens cost?", A1_RIGHT)
    assert second["injected"] == [] and "17 / 17" not in prompt


# Issue 19, the full 24-problem eval run (E-CoT on): three wrong traces reached the active cache
# with every check passing. Their replies, as the model wrote them; the right forms beside them.
U3 = "A runner covers 5 km in 25 minutes. What is the speed in km/h?"
U3_WRONG = """Context: 5 km in 25 minutes

Reasoning:
1. speed = distance / time [principle: v = d / t]
Verification:
- recomputation: 5 km / 25 minutes = 0.2 km/min
- unit_check: 5 km / 25 minutes -> km/min
- boundary_test: 0.2 km/min in [0, 300]
Outcome: 0.2 km/min
Confidence: high"""
U3_RIGHT = U3_WRONG.replace("= 0.2 km/min", "= 12 km/h").replace("-> km/min", "-> km/h").replace(
    "0.2 km/min in", "12 km/h in").replace("Outcome: 0.2 km/min", "Outcome: 12 km/h")
U8 = "A car uses 6 L of fuel per 100 km. How many liters does it use for 250 km?"
U8_WRONG = """Context: 6 L of fuel per 100 km

Reasoning:
1. fuel_consumption = 6 L / 100 km = 0.06 L/km [principle: fuel = distance / fuel consumption]
Verification:
- recomputation: 6 L / 100 km = 0.06 L/km
- unit_check: 6 L / 100 km -> L/km

Answer: 0.06 L/km

Confidence: high"""
A3 = "A price rises from 80 to 92. By what percentage did it increase?"
A3_WRONG = """Context: A price rises from 80 to 92.
Reasoning:
1. Increase in price = 92 - 80 = 12 [principle: change = final - initial]
Verification:
- recomputation: 92 - 80 = 12
- boundary_test: 12 in [0, 100]
Outcome: 12%
Confidence: high"""
A3_RIGHT = """Context: A price rises from 80 to 92.
Reasoning:
1. percent increase = (92 - 80) / 80 * 100 = 15 [principle: change / initial * 100]
Verification:
- recomputation: (92 - 80) / 80 * 100 = 15
- boundary_test: 15 in [0, 100]
Outcome: 15%
Confidence: high"""


@pytest.mark.parametrize(("question", "reply", "tag"), [(U3, U3_WRONG, "unit_mismatch"), (U8, U8_WRONG, "unit_mismatch")])
def test_an_answer_not_in_the_form_asked_waits_in_review_and_is_never_injected(
        rig: Any, question: str, reply: str, tag: str) -> None:
    c, engine = rig
    first, _ = _turn(c, engine, question, reply)
    assert first["tier"] == "review" and first["confidence"] != "high"
    assert tag in first["error_tags"]
    second, prompt = _turn(c, engine, question, reply)
    assert second["injected"] == [] and "Past solved problems" not in prompt


def test_a_posted_percentage_computed_as_a_difference_waits_in_review(rig: Any) -> None:
    c, _ = rig
    wrong = _posted(c, A3, A3_WRONG)
    assert wrong["tier"] == "review" and wrong["record"]["outcome"]["confidence"] == "medium"
    assert wrong["record"]["evaluation"]["error_tags"] == ["answer_not_computed"]
    right = _posted(c, A3, A3_RIGHT)
    assert right["tier"] == "active" and right["record"]["outcome"]["confidence"] == "high"
    assert _active_ids(c, A3) == [right["record"]["metadata"]["id"]]


@pytest.mark.parametrize(("question", "reply"), [(U3, U3_RIGHT)])
def test_the_same_problems_answered_in_the_form_asked_are_reused(rig: Any, question: str, reply: str) -> None:
    c, engine = rig
    first, _ = _turn(c, engine, question, reply)
    assert first["tier"] == "active" and first["confidence"] == "high", first
    second, prompt = _turn(c, engine, question, reply)
    assert second["injected"] == [first["id"]] and "Past solved problems" in prompt


def test_a_chat_turn_reports_the_traces_own_error_tags_apart_from_the_archives_query(rig: Any) -> None:
    """The a3 trace through chat reported ``arithmetic_error, out_of_bounds`` (the tags the archive
    was searched by: the problem states plain numbers) where the stored record said
    ``answer_not_computed``. The response's ``error_tags`` are now the stored record's."""
    c, engine = rig
    first, _ = _turn(c, engine, A3, A3_WRONG)
    stored = c.get(f"/v1/experiences/{first['id']}", headers=H).json()["record"]
    assert first["error_tags"] == stored["evaluation"]["error_tags"] == ["answer_not_computed"]
    assert first["searched_tags"] == ["arithmetic_error", "out_of_bounds"]
    assert _posted(c, A3, A3_WRONG)["record"]["evaluation"]["error_tags"] == first["error_tags"]


# Held-out h14 (loadtests/data/eval-experiences-holdout.jsonl): the model's wrong LATE-1 answer
# "2% of 1,200 = 24" (expected 120), which leaves out the 5 months, through a chat turn of a cluster
# with the eval's rules; and a right one that takes the cap.
H14 = "A balance of 1,200 is paid 5 full months late. What is the late fee under LATE-1?"
H14_WRONG = """Context: 1,200 paid 5 full months late
Reasoning:
1. balance = 1,200 [principle: balance = total]
2. months = 5 [principle: months = late]
3. late_fee = 2% of balance per full month late, at most 10% of the balance [variables: balance, months]
Verification:
- recomputation: 2% of 1,200 = 24
- boundary_test: 24 in [0, 100]
Outcome: 24
Confidence: high"""
H14_RIGHT = """Context: 1,200 paid 5 full months late
Reasoning:
1. rate = min(0.02 * 5, 0.10) = 0.10 [principle: LATE-1, 2% a month capped at 10%]
2. fee = 1,200 * 0.10 = 120 [principle: fee = balance * rate]
Verification:
- recomputation: 1,200 * 0.10 = 120
- regulatory_check: LATE-1 with balance=1200, months=5 -> 120
Outcome: 120
Confidence: high"""


def test_a_rule_answer_that_leaves_out_a_stated_quantity_waits_in_review(tmp_path: Path) -> None:
    from recallserve.serve.experience._eval_problems import RULES

    emb = HashingEmbedder(384)
    engine = ScriptedEngine([H14_WRONG, H14_WRONG, H14_RIGHT, H14_RIGHT])
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", rules=RULES, min_similarity=0.1,
                                                     audit_share=0.0), emb.embed)
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), experiences=experiences)
    auth = Authenticator(KEYS)

    def ask() -> tuple[dict[str, Any], str]:
        r = c.post("/v1/chat/completions", headers=H, json={
            "model": "recallserve", "max_tokens": 96, "messages": [{"role": "user", "content": H14}],
            "metadata": {"reasoning": "segmented", "task_domain": "rules", "topic": "rules/fees"}})
        assert r.status_code == 200, r.text
        return r.json()["recallserve"]["experience"], "\n".join(m.content for m in engine.calls[-1][0])

    with TestClient(create_app(pipeline, auth, routers=[build_router(experiences, auth)])) as c:
        wrong, _ = ask()
        assert wrong["tier"] == "review" and wrong["confidence"] == "medium"
        assert wrong["error_tags"] == ["ungrounded_quantity"]
        again, prompt = ask()
        assert again["injected"] == [] and "2% of 1,200" not in prompt
        right, _ = ask()
        assert right["tier"] == "active" and right["confidence"] == "high" and right["error_tags"] == []
        _, prompt = ask()
        assert "1,200 * 0.10 = 120" in prompt
    experiences.close()


# Issue 19, review load: right traces verified by code are reused without review; the held-out
# eval kept 11 of 12 right answers in review (loadtests/results/eval-experiences-qwen2.5-1.5b-holdout.md).
def _reply(context: str, steps: list[str], checks: list[str], answer: str) -> str:
    """A segmented reply as the model writes it (steps ``text [principle: ...]``, checks ``type: target``)."""
    lines = [f"Context: {context}", "Reasoning:", *(f"{n}. {t}" for n, t in enumerate(steps, start=1)),
             "Verification:", *(f"- {c}" for c in checks), f"Outcome: {answer}", "Confidence: high"]
    return "\n".join(lines)


H6 = "A train travels 210 km in 1 hour 45 minutes. What is its average speed in km/h?"
# NOTE: the held-out h6 reply as stored (after/without): no step says 1 h 45 min = 1.75 h.
H6_RIGHT = _reply("210 km in 1 hour 45 minutes", ["speed = distance / time [principle: v = d / t]"],
                  ["recomputation: 210 / 1.75 = 120", "unit_check: 210 km / 1.75 h -> km/h",
                   "boundary_test: 120 in [0, 300]"], "120 km/h")
H2 = "A town's population grew from 12,000 to 13,800. What was the percentage increase?"
H2_STEPS = ["increase = 13,800 - 12,000 = 1,800 [principle: increase = new - old]",
            "rate = 1,800 / 12,000 = 0.15 [principle: percentage increase = increase / old]"]
PROSE = "unit_check: 15% is a percentage"


def test_a_compound_duration_trace_is_reused_without_review(rig: Any) -> None:
    c, engine = rig
    first, _ = _turn(c, engine, H6, H6_RIGHT)
    assert first["tier"] == "active" and first["confidence"] == "high" and first["error_tags"] == [], first
    second, prompt = _turn(c, engine, H6, H6_RIGHT)
    assert second["injected"] == [first["id"]] and "210 / 1.75 = 120" in prompt


def test_a_prose_check_does_not_keep_a_verified_trace_in_review(rig: Any) -> None:
    c, engine = rig
    # NOTE: the increase 1,800 is computed from the stated numbers by a check, so the ratio is grounded.
    right, _ = _turn(c, engine, H2, _reply("12,000 to 13,800", H2_STEPS, [
        "recomputation: 13,800 - 12,000 = 1,800", "recomputation: 1,800 / 12,000 = 0.15", PROSE], "15%"))
    assert right["tier"] == "active" and right["confidence"] == "high" and right["error_tags"] == [], right
    # Without it, 1,800 is a number of unknown origin to code (held-out h2): the ratio verifies nothing.
    ratio, _ = _turn(c, engine, H2, _reply("12,000 to 13,800", H2_STEPS, ["recomputation: 1,800 / 12,000 = 0.15", PROSE], "15%"))
    assert ratio["tier"] == "review" and ratio["error_tags"] == ["ungrounded_check"], ratio
    stored = c.get(f"/v1/experiences/{right['id']}", headers=H).json()["record"]
    assert [v["status"] for v in stored["verification"] if v["type"] == "unit_check"] == ["not_run"]
    # Prose checks alone verify nothing; an answer no executed check computed waits as before.
    alone, _ = _turn(c, engine, H2, _reply("12,000 to 13,800", H2_STEPS, [PROSE], "15%"))
    assert alone["tier"] == "review" and alone["confidence"] == "medium"
    difference, _ = _turn(c, engine, H2, _reply("12,000 to 13,800", H2_STEPS[:1],
                                                ["recomputation: 13,800 - 12,000 = 1800", PROSE], "1800"))
    assert difference["tier"] == "review" and difference["error_tags"] == ["answer_not_computed"], difference


CONVERT = "Convert 15 m/s to km/h."
TRIP = "Under TRIP-2, a car travels 120 km in 2 h. What is its speed?"


def _one_step(context: str, step: str, answer: str) -> str:
    return _reply(context, [f"{step} [principle: the formula]"], [f"recomputation: {step}"], answer)


@pytest.mark.parametrize(("question", "reply", "tier", "tags"), [
    (CONVERT, _one_step("15 m/s", "15 * 3.6 = 54", "54 km/h"), "active", []),
    (CONVERT, _one_step("15 m/s", "15 / 1000 = 0.015", "0.015 km/s"), "review", ["unit_mismatch"]),
    # The answer in the asked unit, of the wrong magnitude: the stated 15 m/s is 54 km/h (second held-out g3).
    (CONVERT, _one_step("15 m/s", "90 / 1.5 = 60", "60 km/h"), "review", ["unit_mismatch"]),
    # The 2 of the rule id TRIP-2 is no stated 2: the 2 h keeps its unit, so the answer's unit is checked.
    (TRIP, _one_step("120 km in 2 h", "120 / 2 = 60", "60 km/h"), "active", []),
    (TRIP, _one_step("120 km in 2 h", "120 / 2 = 60", "60 m/s"), "review", ["unit_mismatch"]),
])
def test_the_unit_asked_or_stated_decides_the_tier(rig: Any, question: str, reply: str, tier: str, tags: list[str]) -> None:
    c, engine = rig
    out, _ = _turn(c, engine, question, reply)
    assert out["tier"] == tier and out["error_tags"] == tags, out
    again, prompt = _turn(c, engine, question, reply)
    assert (again["injected"] == [out["id"]]) is (tier == "active")


H15 = "A customer orders exactly 10 mugs at 7.50 each. What does the order cost under DISC-1?"
H15_WRONG = _reply("10 mugs at 7.50 each", ["cost = 10 * 7.50 = 75 [principle: cost = quantity * price]"],
                   ["recomputation: 10 * 7.50 = 75", "unit_check: 10 mugs * 7.50 each"], "$75")
H15_RIGHT = _reply("10 mugs at 7.50 each", ["10 >= 10 so 10% off: cost = 10 * 7.50 * 0.9 = 67.5 [principle: DISC-1]"],
                   ["recomputation: 10 * 7.50 * 0.9 = 67.5", "regulatory_check: DISC-1 with qty=10, price=7.5 -> 67.5",
                    "unit_check: 10 mugs * 7.50 each"], "67.5")


def test_a_rule_answer_the_rule_never_computed_waits_in_review(tmp_path: Path) -> None:
    """Held-out h15: with its prose unit check not run, only the rule requirement keeps ``$75`` out."""
    from recallserve.serve.experience._eval_problems import RULES

    emb = HashingEmbedder(384)
    engine = ScriptedEngine([H15_WRONG, H15_RIGHT])
    experiences = ExperienceService(ExperienceConfig(data_dir=tmp_path / "exp", rules=RULES, min_similarity=0.1,
                                                     audit_share=0.0), emb.embed)
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), experiences=experiences)
    with TestClient(create_app(pipeline, Authenticator(KEYS), routers=[build_router(experiences, Authenticator(KEYS))])) as c:
        def ask() -> dict[str, Any]:
            r = c.post("/v1/chat/completions", headers=H, json={
                "model": "recallserve", "max_tokens": 96, "messages": [{"role": "user", "content": H15}],
                "metadata": {"reasoning": "segmented", "task_domain": "rules", "topic": "rules/orders"}})
            assert r.status_code == 200, r.text
            return r.json()["recallserve"]["experience"]

        wrong = ask()
        assert wrong["tier"] == "review" and wrong["error_tags"] == ["answer_not_computed"], wrong
        right = ask()
        assert right["tier"] == "active" and right["confidence"] == "high" and right["error_tags"] == [], right
    experiences.close()
