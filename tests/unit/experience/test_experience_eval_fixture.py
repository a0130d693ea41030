"""The shipped eval fixture and the eval runner's bookkeeping (no model: a scripted engine)."""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import pytest

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._eval_experiences import _load_problems, _run_condition, _summary, is_correct
from recallserve.serve.experience import ExperienceRecord, Rule, RuleTable, verify_record
from recallserve.serve.experience._eval_problems import PROBLEMS, RULES, SEEDS

from .conftest import bag_of_words_embed
from .test_experience_service import ScriptedEngine


def test_fixture_shape():
    assert len(PROBLEMS) >= 20
    assert {p["domain"] for p in PROBLEMS} == {"arithmetic", "units", "rules"}
    assert len({p["id"] for p in PROBLEMS}) == len(PROBLEMS)


def test_every_seed_verifies_to_high_confidence():
    table = RuleTable(Rule.model_validate(r) for r in RULES)
    for seed in SEEDS:
        rec = verify_record(ExperienceRecord.model_validate(seed), table)
        assert rec.outcome.confidence == "high", [(v.type, v.status, v.notes) for v in rec.verification]


@pytest.mark.parametrize(("rule", "inputs", "expected_id"), [
    ("OT-1", {"rate": 22, "hours": 46}, "r1"), ("OT-1", {"rate": 18, "hours": 38}, "r2"),
    ("SHIP-1", {"total": 64, "weight": 3.5}, "r3"), ("SHIP-1", {"total": 120, "weight": 8}, "r4"),
    ("LATE-1", {"balance": 500, "months": 3}, "r5"), ("LATE-1", {"balance": 800, "months": 7}, "r6"),
    ("DISC-1", {"qty": 12, "price": 15}, "r7"),
])
def test_rule_problems_expected_answers_follow_the_rules(rule, inputs, expected_id):
    table = RuleTable(Rule.model_validate(r) for r in RULES)
    expected = next(p["expected"] for p in PROBLEMS if p["id"] == expected_id)
    assert table.evaluate(rule, inputs) == pytest.approx(expected)


HOLDOUT = Path(__file__).resolve().parents[3] / "loadtests" / "data" / "eval-experiences-holdout.jsonl"


@pytest.mark.parametrize(("rule", "inputs", "expected_id"), [
    ("OT-1", {"rate": 25, "hours": 52}, "h12"), ("SHIP-1", {"total": 99, "weight": 4}, "h13"),
    ("LATE-1", {"balance": 1200, "months": 5}, "h14"), ("DISC-1", {"qty": 10, "price": 7.5}, "h15"),
    ("SPEED-URBAN", {"speed": 50}, "h16"),
])
def test_holdout_problems_load_and_their_rule_answers_follow_the_rules(rule, inputs, expected_id):
    """The held-out set (loadtests/data) is read as ``--problems`` reads it, ids distinct from the
    shipped set's, and its rule answers are the rule table's (h16: ``yes`` is ``True``)."""
    problems = _load_problems(HOLDOUT, None)
    assert len(problems) == 16 and {p["id"] for p in problems}.isdisjoint(p["id"] for p in PROBLEMS)
    table = RuleTable(Rule.model_validate(r) for r in RULES)
    expected = next(p["expected"] for p in problems if p["id"] == expected_id)
    got = table.evaluate(rule, inputs)
    assert got is True if expected == "yes" else got == pytest.approx(expected)


@pytest.mark.parametrize(("answer", "expected", "ok"), [
    ("80 km/h", 80, True), ("79.5", 80, True), ("78", 80, False), (None, 80, False), ("15%", 15, True),
    ("No, it does not comply", "no", True), ("yes", "no", False), ("no... yes", "no", False),
])
def test_is_correct(answer, expected, ok):
    assert is_correct(answer, expected) is ok


def test_load_problems_errors(tmp_path):
    assert len(_load_problems(None, 3)) == 3
    bad = tmp_path / "p.jsonl"
    bad.write_text('{"id": "x", "question": "q"}\n')
    with pytest.raises(UserError, match="missing domain, expected, topic"):
        _load_problems(bad, None)
    with pytest.raises(UserError, match="does not exist"):
        _load_problems(tmp_path / "nope.jsonl", None)
    with pytest.raises(UserError, match="--limit"):
        _load_problems(None, 0)
    assert [p["id"] for p in _load_problems(None, None, "u2, a1")] == ["a1", "u2"]
    with pytest.raises(UserError, match="unknown problem ids zz"):
        _load_problems(None, None, "a1,zz")


class _Bar:
    n = 0

    def update(self, k: int) -> None:
        self.n += k


def test_run_condition_with_scripted_engine():
    reply = json.dumps({"context": {"facts": ["f"]}, "reasoning": ["0.15 * 240 = 36"],
                        "verification": [{"type": "recomputation", "target": "0.15 * 240", "expected": 36},
                                         {"type": "recomputation", "target": "0.15 * 250", "expected": 36}],
                        "outcome": {"answer": "36", "confidence": "high"}})
    engine = ScriptedEngine([reply, "garbage"])
    bar = _Bar()
    rows = asyncio.run(_run_condition(engine, bag_of_words_embed, PROBLEMS[1:3], inject=True, max_tokens=64,
                                      constrained=False, progress=bar))
    assert bar.n == 2 and [r["correct"] for r in rows] == [True, False]
    assert "Past solved problems" in engine.prompts[0][1].content  # the 20%-of-150 seed was injected
    s = _summary(rows)
    assert s["parse_success_rate"] == 0.5 and s["model_check_pass_rate"] == 0.5 and s["accuracy"] == 0.5
    # The extracted checks of 0.15 * 240 (recompute at, grounding: 15% is 0.15, two around 240) pass and join the rate.
    assert (s["extracted_items"], s["extracted_pass_rate"]) == (4, 1.0)
    assert s["verification_pass_rate"] == (1 + 4) / (2 + 4)
    assert s["all_checks_pass_rate"] == 0.0 and s["confidence"] == {"low": 1, "none": 1}


def test_report_counts_unreviewed_wrong_traces_and_the_fallback():
    # a1 (17 pens at 3 = 51): a wrong answer whose only check states no bounds (doubtful, medium):
    # the old rule filed it active, review-before-reuse keeps it in review.
    wrong_medium = json.dumps({"context": {"facts": ["f"]}, "reasoning": ["17 * 3 = 41"],
                               "verification": [{"type": "boundary_test", "target": "41"}],
                               "outcome": {"answer": "41", "confidence": "high"}})
    # a2 (15% of 240 = 36): unparsable, then rewritten by the model into the format.
    rewritten = json.dumps({"context": {"facts": ["f"]}, "reasoning": ["0.15 * 240 = 36"],
                            "verification": [{"type": "recomputation", "target": "0.15 * 240", "expected": 36}],
                            "outcome": {"answer": "36", "confidence": "high"}})
    engine = ScriptedEngine([wrong_medium, "thirty-six, roughly", rewritten])
    rows = asyncio.run(_run_condition(engine, bag_of_words_embed, PROBLEMS[0:2], inject=False, max_tokens=64,
                                      constrained=False, progress=_Bar(), fallback=True))
    assert [(r["tier_before"], r["tier_after"], r["correct"]) for r in rows] == [
        ("active", "review", False), ("active", "active", True)]
    s = _summary(rows)
    assert s["unreviewed_wrong_before"] == 0.5 and s["unreviewed_wrong_after"] == 0.0
    assert s["parse_rate_without_fallback"] == 0.5 and s["parse_success_rate"] == 1.0 and s["rewritten"] == 1


def test_modes_share_the_generation_and_differ_by_their_rules():
    from recallserve.deployments.cli._eval_experiences import _Memo

    # u1 (150 km in 2.5 h): the right number in the wrong unit. Before issue 19 only the model's
    # own recomputation ran (it passes: high, filed active); after, the extracted unit check fails it.
    reply = ("Context: 150 km in 2.5 h\nReasoning:\n1. 150 / 2.5 = 60 [principle: v = d / t]\n"
             "Verification:\n- recomputation: 150 / 2.5 = 60\nOutcome: 60 m/s\nConfidence: high")
    engine = ScriptedEngine([reply])
    memo = _Memo(engine)
    u1 = [p for p in PROBLEMS if p["id"] == "u1"]
    after = asyncio.run(_run_condition(memo, bag_of_words_embed, u1, inject=False, max_tokens=64,
                                       constrained=False, progress=_Bar(), mode="after"))
    before = asyncio.run(_run_condition(memo, bag_of_words_embed, u1, inject=False, max_tokens=64,
                                        constrained=False, progress=_Bar(), mode="before"))
    assert len(engine.prompts) == 1 and memo.replayed == 1  # one generation, read twice
    assert (after[0]["replayed"], before[0]["replayed"]) == (False, True)
    assert (before[0]["extracted_checks"], before[0]["confidence"], before[0]["tier"]) == (0, "high", "active")
    assert after[0]["extracted_checks"] > 0 and after[0]["confidence"] == "low" and after[0]["tier"] == "review"
    assert "unit_mismatch" in after[0]["error_tags"]
    sa, sb = _summary(after), _summary(before)
    assert (sa["generations"], sb["generations"]) == (1, 0)
    assert sb["verification_pass_rate"] == 1.0 and sa["verification_pass_rate"] < 1.0
    assert sa["active_share"] == 0.0 and sb["active_share"] == 1.0


@pytest.mark.slow
def test_replay_verifies_stored_replies_again_without_a_model(tmp_path) -> None:
    """``--replay``: the stored replies of a run are filed again by the current rules (no model)."""
    import json

    from recallserve.deployments.cli import main

    reply = ("Context: 5 km in 25 minutes\nReasoning:\n1. speed = distance / time [principle: v = d / t]\n"
             "Verification:\n- recomputation: 5 km / 25 minutes = 0.2 km/min\n- unit_check: 5 km / 25 minutes -> km/min\n"
             "Outcome: 0.2 km/min\nConfidence: high")
    rows = [{"id": "u3", "mode": m, "condition": c, "raw_text": reply}
            for m in ("after", "before") for c in ("with", "without")]
    stored = tmp_path / "run.json"
    stored.write_text(json.dumps({"model": "m", "rows": rows}))
    out = tmp_path / "replay.json"
    assert main(["eval", "experiences", "--replay", str(stored), "--ids", "u3", "--out", str(out)]) == 0
    data = json.loads(out.read_text())
    assert data["replayed_from"] == str(stored) and data["generations_reused"] == 4
    after = [r for r in data["rows"] if r["mode"] == "after"]
    assert [r["tier"] for r in after] == ["review", "review"]
    assert all("unit_mismatch" in r["error_tags"] and not r["correct"] for r in after)
    assert data["summary"]["after/with"]["unreviewed_wrong"] == 0.0
