"""The verifier's named rules (:mod:`recallserve.serve.experience.checks`): one test per rule, on
the record the verifier returns, and one that the verifier runs the registry (a rule taken out of
the table no longer acts)."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from recallserve.serve.experience import ExperienceRecord, RuleTable, verify_record
from recallserve.serve.experience import checks
from recallserve.serve.experience._asked import AnswerForm
from recallserve.serve.experience._eval_problems import RULES
from recallserve.serve.experience._grounded import TAG as UNGROUNDED_TAG
from recallserve.serve.experience._rules import Rule
from recallserve.serve.experience._tags import ANSWER_TAG

EVAL_RULES = RuleTable([Rule.model_validate(r) for r in RULES])


def _record(text: str, checks_: list[dict], answer: str, steps: Sequence[str] = ("compute",)) -> ExperienceRecord:
    return ExperienceRecord.model_validate({
        "metadata": {"source_model": "test-model"}, "context": {"raw_text": text},
        "reasoning": [{"step_id": i, "text": t} for i, t in enumerate(steps, start=1)],
        "verification": checks_, "outcome": {"answer": answer}})


def _verify(rec: ExperienceRecord) -> ExperienceRecord:
    return verify_record(rec, EVAL_RULES, extract=True)


def test_the_registry_names_each_rule_once_with_a_general_docstring() -> None:
    assert list(checks.CHECKS) == ["asked_unit", "percent_is_ratio", "mean_divides", "answer_computed", "grounded"]
    for name, check in checks.CHECKS.items():
        assert check.name == name
    assert [g.tag for g in checks.gates()] == [ANSWER_TAG, UNGROUNDED_TAG]


def test_asked_unit_fails_an_answer_in_another_unit() -> None:
    rec = _record("A train covers 12 km in 60 minutes. What is its speed in km/h?",
                  [{"type": "recomputation", "target": "12 / 60 = 0.2"}], "0.2 km/min")
    out = _verify(rec)
    asked = [v for v in out.verification if v.input.get("asked")]
    assert [v.status for v in asked] == ["fail"] and out.outcome.confidence == "low"
    # the same answer in the asked unit passes the rule
    ok = _verify(_record(rec.context.raw_text, [{"type": "recomputation", "target": "12 / 60 * 60 = 12"}], "12 km/h"))
    assert [v.status for v in ok.verification if v.input.get("asked")] == ["pass"]


def test_percent_is_ratio_a_difference_does_not_compute_a_percentage() -> None:
    text = "A price rises from 80 to 92. What is the percentage increase?"
    diff = _verify(_record(text, [{"type": "recomputation", "target": "92 - 80 = 12"}], "12%"))
    assert diff.outcome.confidence != "high" and ANSWER_TAG in diff.evaluation.error_tags
    ratio = _verify(_record(text, [{"type": "recomputation", "target": "(92 - 80) / 80 * 100 = 15"}], "15%"))
    assert ANSWER_TAG not in ratio.evaluation.error_tags


def test_mean_divides_a_sum_does_not_compute_an_average() -> None:
    text = "What is the average of 4, 8, 15 and 23?"
    total = _verify(_record(text, [{"type": "recomputation", "target": "4 + 8 + 15 + 23 = 50"}], "50"))
    assert total.outcome.confidence != "high" and ANSWER_TAG in total.evaluation.error_tags
    mean = _verify(_record(text, [{"type": "recomputation", "target": "(4 + 8 + 15 + 23) / 4 = 12.5"}], "12.5"))
    assert ANSWER_TAG not in mean.evaluation.error_tags


def test_answer_computed_checks_beside_the_answer_do_not_make_it_high() -> None:
    rec = _record("A worker earns 20 per hour for 40 hours plus 5 overtime hours at 1.5 times.",
                  [{"type": "recomputation", "target": "20 * 40 = 800"}], "950")
    out = _verify(rec)
    assert out.outcome.confidence == "medium" and ANSWER_TAG in out.evaluation.error_tags


def test_grounded_a_number_of_unknown_origin_waits_in_review() -> None:
    out = _verify(_record("A car travels at 90 km/h on a highway. What is its speed in m/s?",
                          [{"type": "recomputation", "target": "90 / 1.5 = 60"}], "60 m/s"))
    assert out.outcome.confidence != "high"
    good = _verify(_record("A car travels at 90 km/h on a highway. What is its speed in m/s?",
                           [{"type": "recomputation", "target": "90 / 3.6 = 25"}], "25 m/s"))
    assert good.outcome.confidence == "high", good.verification


def test_the_verifier_runs_the_registry(monkeypatch: pytest.MonkeyPatch) -> None:
    """The control: with the mean form taken out of the table, a sum computes the "average" again."""
    rec = _record("What is the average of 4, 8, 15 and 23?", [{"type": "recomputation", "target": "4 + 8 + 15 + 23 = 50"}],
                  "50")
    assert ANSWER_TAG in _verify(rec).evaluation.error_tags
    table = {k: v for k, v in checks.CHECKS.items() if k != "mean_divides"}
    monkeypatch.setattr(checks, "CHECKS", table)
    assert all(not isinstance(c, AnswerForm) or c.name != "mean_divides" for c in checks.answer_forms())
    assert ANSWER_TAG not in _verify(rec).evaluation.error_tags
