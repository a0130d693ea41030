"""The grounding check (a formula that leaves out a stated quantity is doubtful) and "the answer
must be a value some passing check computed", on verified records.

Issue 19: with E-CoT on, qwen2.5-coder-1.5b answered a1 ("Pens cost 3 each. How much do 17 pens
cost?") with ``17 / 17 = 1``; every check passed because the formula agrees with itself, and the
wrong trace went to the active cache with high confidence.
"""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from recallserve.serve.experience import ExperienceMetadata, ExperienceRecord, RuleTable, verify_record
from recallserve.serve.experience._calculator import evaluate
from recallserve.serve.experience._eval_problems import PROBLEMS, RULES
from recallserve.serve.experience._extract import SOURCE, extracted_checks
from recallserve.serve.experience._grounding import LITERAL, TAG, literal_value, not_quantities, ungrounded
from recallserve.serve.experience._parser import parse_segmented
from recallserve.serve.experience._rules import Rule
from recallserve.serve.experience._computed import answer_computed
from recallserve.serve.experience._verify import ANSWER_TAG
from recallserve.serve.experience.checks import answer_forms

QWEN = "qwen2.5-coder-1.5b-instruct-q4_k_m"
EVAL_RULES = RuleTable([Rule.model_validate(r) for r in RULES])
A1 = next(p for p in PROBLEMS if p["id"] == "a1")
# The reply stored in loadtests/results/eval-experiences-qwen2.5-1.5b.json (after/with, a1).
A1_REPLY = ("Context: 3 pens cost 17\n\nReasoning:\n1. cost per pen = 17 / 17 = 1 [principle: cost per item = total "
            "cost / number of items]\nVerification:\n- recomputation: 17 / 17 = 1\n- boundary_test: 1 in [0, 17]\n\n"
            "Outcome: 1\n\nConfidence: high")


def _record(text: str, checks: list[dict], answer: str, steps: Sequence[str] = ("compute",)) -> ExperienceRecord:
    return ExperienceRecord.model_validate({
        "metadata": {"source_model": QWEN}, "context": {"raw_text": text},
        "reasoning": [{"step_id": i, "text": t} for i, t in enumerate(steps, start=1)],
        "verification": checks, "outcome": {"answer": answer}})


def _verify(rec: ExperienceRecord) -> ExperienceRecord:
    return verify_record(rec, EVAL_RULES, extract=True)


def _grounding(rec: ExperienceRecord) -> list[tuple[str, object]]:
    return [(v.status, v.actual) for v in rec.verification if v.type == "grounding_check"]


def test_the_a1_trace_17_over_17_is_doubtful_and_tagged() -> None:
    rec = parse_segmented(A1_REPLY).to_record(A1["question"], ExperienceMetadata(source_model=QWEN,
                                                                                 task_domain="arithmetic"))
    assert A1["question"] == "Pens cost 3 each. How much do 17 pens cost?" and A1["expected"] == 51
    out = _verify(rec)
    # Every other check passes, as in the eval run: the formula agrees with itself.
    assert all(v.status == "pass" for v in out.verification if v.type != "grounding_check")
    assert _grounding(out) == [("doubtful", [3.0])]
    assert out.outcome.confidence == "medium" and out.evaluation.error_tags == [TAG]
    # The right formula of the same problem is grounded and keeps high confidence.
    right = _verify(_record(A1["question"], [{"type": "recomputation", "target": "17 * 3 = 51"}], "51"))
    assert _grounding(right) == [("pass", [])] and right.outcome.confidence == "high"


@pytest.mark.parametrize(("text", "formula", "answer"), [
    ("Pens cost 3 each. How much do 17 pens cost?", "17 / 17 = 1", "1"),
    ("Pens cost 3 each. How much do 17 pens cost?", "0.5 * 2 = 1", "1"),  # none of the stated numbers
    ("Pens cost 3 each. How much do 17 pens cost?", "17 * 1.5 = 25.5", "25.5"),  # an invented price
    ("A car travels 150 km in 2.5 hours. What is its average speed in km/h?", "150 / 1 = 150", "150 km/h"),
    ("What is the average of 4, 8, 15 and 23?", "(4 + 8 + 15) / 3 = 9", "9"),
    ("An order totals 64 and weighs 3.5 kg. What is the shipping fee under SHIP-1?", "5 + 2 * 2.5 = 10", "10"),
])
def test_a_formula_that_leaves_out_a_stated_quantity_waits_in_review(text: str, formula: str, answer: str) -> None:
    out = _verify(_record(text, [{"type": "recomputation", "target": formula}], answer))
    assert [s for s, _ in _grounding(out)] == ["doubtful"]
    assert out.outcome.confidence != "high" and TAG in out.evaluation.error_tags


# Correct traces written the way the model writes them (compressed formulas, derived numbers,
# rule constants, comparing steps), for the eval's problems: none may be flagged.
CORRECT = [
    ("a1", "3 * 17 = 51", "51", ["cost = price * count = 3 * 17 = 51"]),
    ("a2", "0.15 * 240 = 36", "36", ["15% of 240 = 0.15 * 240 = 36"]),
    ("a3", "(92 - 80) / 80 * 100 = 15", "15%", ["increase = 92 - 80 = 12"]),
    ("a3", "12 / 80 * 100 = 15", "15", ["compute"]),  # 12 = 92 - 80, derived
    ("a3", "(92 / 80 - 1) * 100 = 15", "15", ["compute"]),
    ("a5", "(4 + 8 + 15 + 23) / 4 = 12.5", "12.5", ["compute"]),
    ("a5", "50 / 4 = 12.5", "12.5", ["compute"]),  # a sum of the stated values
    ("a6", "240 * 0.35 = 84", "84 liters", ["compute"]),
    ("a7", "1440 * 3 / (1 + 2 + 3) = 720", "720", ["compute"]),
    ("a7", "1440 / 6 * 3 = 720", "720", ["parts = 1 + 2 + 3 = 6"]),
    ("a7", "1440 / 6 * 3 = 720", "720", ["compute"]),  # 6 = 1 + 2 + 3 unsaid
    ("a4", "(25 - 7) / 3 = 6", "6", ["3x = 25 - 7 = 18", "x = 18 / 3 = 6"]),
    ("a8", "20 / 5 = 4", "4", ["5y = 11 + 9 = 20"]),  # an intermediate result used
    ("u1", "150 / 2.5 = 60", "60 km/h", ["compute"]),
    ("u2", "72 / 3.6 = 20", "20 m/s", ["compute"]),
    ("u2", "72 * 1000 / 3600 = 20", "20 m/s", ["compute"]),
    ("u4", "1500 * 3 / 1000 = 4.5", "4.5 kWh", ["compute"]),
    ("u4", "1.5 * 3 = 4.5", "4.5 kWh", ["1500 W = 1.5 kW"]),
    ("u5", "2.5 * 3600 = 9000", "9000 s", ["compute"]),
    ("u6", "12 * 3 = 36", "36 J", ["compute"]),
    ("u7", "4 * 2.5 = 10", "10 N", ["compute"]),
    ("u8", "6 * 250 / 100 = 15", "15 L", ["compute"]),
    ("u8", "0.06 * 250 = 15", "15 L", ["compute"]),  # 0.06 = 6 / 100
    ("r1", "22*40 + 1.5*22*6 = 1078", "1078", ["compute"]),  # 6 = 46 - 40
    ("r2", "18 * 38 = 684", "684", ["38 < 40 so no overtime"]),
    ("r3", "5 + 2 * (3.5 - 1) = 10", "10", ["64 < 100 so the fee is not waived"]),
    ("r4", "0 = 0", "0", ["120 >= 100 so shipping is free", "weight 8 kg does not matter"]),
    ("r5", "500 * 0.02 * 3 = 30", "30", ["compute"]),
    ("r5", "500 * 0.06 = 30", "30", ["compute"]),  # 0.06 = 0.02 * 3, LATE-1's rate
    ("r6", "800 * 0.10 = 80", "80", ["7 months * 2% = 14% is above the cap of 10%"]),
    ("r7", "12 * 15 * 0.9 = 162", "162", ["12 >= 10 so 10% off"]),
]


@pytest.mark.parametrize(("pid", "formula", "answer", "steps"), CORRECT)
def test_no_correct_model_style_trace_is_flagged(pid: str, formula: str, answer: str, steps: list[str]) -> None:
    problem = next(p for p in PROBLEMS if p["id"] == pid)
    out = _verify(_record(problem["question"], [{"type": "recomputation", "target": formula}], answer, steps))
    assert _grounding(out) in ([("pass", [])], []), _grounding(out)
    # NOTE: a question under a registered rule is answered by the rule: a recomputation alone
    # does not compute it (serve.experience._computed), whatever its grounding.
    assert TAG not in out.evaluation.error_tags
    assert (ANSWER_TAG in out.evaluation.error_tags) == (problem["domain"] == "rules")


@pytest.mark.parametrize(("text", "formula", "answer"), [
    ("Under rule 3, a box holds 12 bottles. How many bottles are in 7 boxes?", "12 * 7 = 84", "84"),
    ("In 2024 a box held 12 bottles. How many bottles were in 7 boxes?", "12 * 7 = 84", "84"),
    ("1. A box holds 12 bottles.\n2. There are 7 boxes.\nHow many bottles?", "12 * 7 = 84", "84"),
    ("On 5 March 2024 a box held 12 bottles. How many bottles were in 7 boxes?", "12 * 7 = 84", "84"),
    ("Order #4471: a box holds 12 bottles. How many bottles are in 7 boxes?", "12 * 7 = 84", "84"),
    ("The 2nd shelf has 7 boxes of 12 bottles. How many bottles?", "12 * 7 = 84", "84"),
    ("What is 15% of 240?", "0.15 * 240 = 36", "36"),
    ("A price of 80 rises by 15%. New price?", "80 * 1.15 = 92", "92"),
    ("A price of 80 falls by 15%. New price?", "80 * (1 - 0.15) = 68", "68"),
])
def test_numbers_that_are_not_quantities_are_not_asked_for(text: str, formula: str, answer: str) -> None:
    out = _verify(_record(text, [{"type": "recomputation", "target": formula}], answer))
    assert _grounding(out) == [("pass", [])] and out.outcome.confidence == "high"


def test_non_quantities_and_the_rule_itself() -> None:
    assert not_quantities("Under rule 3 (OT-1), item #2 of order 77123, in 2024, on 2024-03-05, the 4th.") >= {
        3.0, 1.0, 2.0, 77123.0, 2024.0, 5.0, 4.0}
    assert not_quantities("A box holds 12 bottles.") == set()
    # The intermediate step's result (800) is in the formula: its inputs are used.
    assert ungrounded("800 + 150", [20, 40, 5], ["", "h", "h"], ["20 * 40 = 800", "1.5 * 20 * 5 = 150"], {}) == []
    assert ungrounded("800 + 150", [20, 40, 5], ["", "h", "h"], ["20 * 40 = 800"], {}) == [5.0]
    # A named quantity of the record counts as used.
    assert ungrounded("d / t", [120, 1.5], ["km", "h"], [], {"d": 120.0, "t": 1.5}) == []


def test_the_grounding_check_is_run_by_the_bounded_verifier() -> None:
    rec = _record(A1["question"], [{"type": "recomputation", "target": "17 / 17 = 1"}], "1")
    item = next(v for v in extracted_checks(rec) if v.type == "grounding_check")
    assert item.input["source"] == SOURCE and item.input["stated"] == [3.0, 17.0] and item.status == "not_run"
    # A spent budget fails it unrun, like every other check.
    out = verify_record(rec, EVAL_RULES, extract=True, max_steps=1, seconds=10.0)
    assert next(v for v in out.verification if v.type == "grounding_check").status == "fail"
    # A malformed client-written grounding check fails (never a 500, never a pass).
    bad = _record(A1["question"], [{"type": "grounding_check", "target": "17 / 17", "input": {"stated": "3"}}], "1")
    got = verify_record(bad, EVAL_RULES).verification[0]
    assert got.status == "fail" and got.notes.startswith("cannot execute")


# "The answer must equal a value some passing check computed."


def test_checks_that_pass_beside_the_answer_do_not_make_it_high() -> None:
    # The intermediate recomputation (800) and a bound of the answer pass; nothing computed 950.
    rec = _record("A worker earns 20 per hour for 40 hours plus 5 overtime hours at 1.5 times.",
                  [{"type": "recomputation", "target": "20 * 40 = 800"},
                   {"type": "boundary_test", "target": "950", "input": {"min": 0, "max": 5000}}], "950")
    out = _verify(rec)
    assert {v.status for v in out.verification} == {"pass"}
    assert out.outcome.confidence == "medium" and out.evaluation.error_tags == [ANSWER_TAG]
    # With the answer's own recomputation it is high again.
    rec = _record(rec.context.raw_text, [{"type": "recomputation", "target": "20 * 40 + 1.5 * 20 * 5"}], "950")
    assert _verify(rec).outcome.confidence == "high"


@pytest.mark.parametrize(("checks", "answer", "want"), [
    ([{"type": "recomputation", "target": "100 / 3", "expected": 33.3333333}], "33.3", True),  # rounded answer
    ([{"type": "recomputation", "target": "100 / 3"}], "34", False),
    ([{"type": "unit_check", "target": "120 km / 1.5 h", "expected": "km/h"}], "80 km/h", True),
    ([{"type": "regulatory_check", "target": "SHIP-1", "input": {"total": 40, "weight": 2}, "expected": 7}], "7", True),
    ([{"type": "regulatory_check", "target": "SPEED-URBAN", "input": {"speed": 58}, "expected": "false"}], "no", True),
    ([{"type": "back_substitution", "target": "3*x + 7 = 25", "input": {"x": 6}}], "x = 6", True),
    ([{"type": "boundary_test", "target": "6", "input": {"min": 0, "max": 25}}], "6", False),
    ([{"type": "recomputation", "target": "2 + 2", "expected": 4}], "four", None),  # nothing to compare with
])
def test_answer_computed(checks: list[dict], answer: str, want: bool | None) -> None:
    checked = verify_record(_record("q", checks, answer), EVAL_RULES).verification
    assert [v.status for v in checked] == ["fail" if answer == "34" else "pass"], checked
    assert answer_computed(checked, answer, forms=answer_forms()) is want


def test_a_reply_that_fills_every_check_slot_still_gets_the_grounding_check() -> None:
    """32 checks of the model's own (all passing: the formula agrees with itself) leave no slot
    free; the checks code derives from the problem still run, in the last slots."""
    own = [{"type": "recomputation", "target": "17 / 17 = 1"}] * 32
    out = _verify(_record(A1["question"], own, "1"))
    assert len(out.verification) == 32
    assert _grounding(out) == [("doubtful", [3.0])]
    assert out.outcome.confidence == "medium" and TAG in out.evaluation.error_tags


# Held-out h14 (loadtests/data/eval-experiences-holdout.jsonl), the model's reply of the run
# after/without, less its own unit check (which happened to be doubtful and alone kept the wrong
# trace from the active cache). "2% of 1,200" was read as the literals 2, 1 and 200: the around
# checks moved the "1" into a list that passed whatever the answer, and the 2 of "2%", taken for a
# derived value (10 / 5), grounded the unused 5 months: high confidence for a wrong 24 (LATE-1: 120).
H14 = "A balance of 1,200 is paid 5 full months late. What is the late fee under LATE-1?"
H14_REPLY = ("Context: 1,200 paid 5 full months late\nReasoning:\n1. balance = 1,200 [principle: balance = total]\n"
             "2. months = 5 [principle: months = late]\n3. late_fee = 2% of balance per full month late, at most 10% "
             "of the balance [variables: balance, months]\nVerification:\n- recomputation: 2% of 1,200 = 24\n"
             "- boundary_test: 24 in [0, 100]\nOutcome: 24\nConfidence: high")


def test_literals_are_read_as_the_calculator_reads_them() -> None:
    expr = "2% of 1,200 + max(2,3) + 12,345.5"
    assert [literal_value(m.group(0)) for m in LITERAL.finditer(expr)] == [2.0, 1200.0, 2.0, 3.0, 12345.5]
    assert evaluate(expr) == pytest.approx(0.02 * 1200 + 3 + 12345.5)


def test_the_h14_trace_that_leaves_out_the_months_waits_in_review() -> None:
    out = _verify(parse_segmented(H14_REPLY).to_record(H14, ExperienceMetadata(source_model=QWEN, task_domain="rules")))
    assert _grounding(out) == [("doubtful", [5.0])]
    assert out.outcome.confidence == "medium" and out.evaluation.error_tags == [TAG]
    around = [v for v in out.verification if v.type == "boundary_test" and v.input.get("source") == SOURCE]
    # The whole 1,200 is moved by 1% (and nothing else): the around checks compare numbers again.
    assert len(around) == 2 and all("(1188)" in v.target and "(1212)" in v.target and "0.99" not in v.target
                                    for v in around)


# Right traces of the held-out rule problems, written the way the model writes them: none flagged.
HOLDOUT_CORRECT = [
    (H14, "1,200 * 0.10 = 120", "120", ["5 months * 2% = 10%, at the cap of 10%"]),
    (H14, "1200 * 10% = 120", "120", ["rate = min(0.02 * 5, 0.10) = 0.10"]),
    (H14, "1,200 * min(0.02 * 5, 0.10) = 120", "120", ["compute"]),
    ("An employee's hourly rate is 25 and she works 52 hours in one week. What is her weekly pay under OT-1?",
     "25*40 + 1.5*25*12 = 1450", "1450", ["compute"]),  # 12 = 52 - 40
    ("An order comes to 99 and weighs 4 kg. What is the shipping fee under SHIP-1?", "5 + 2 * (4 - 1) = 11", "11",
     ["99 < 100 so not free"]),
    ("A customer orders exactly 10 mugs at 7.50 each. What does the order cost under DISC-1?", "10 * 7.50 * 0.9 = 67.5",
     "67.5", ["10 >= 10 so 10% off"]),
]


@pytest.mark.parametrize(("text", "formula", "answer", "steps"), HOLDOUT_CORRECT)
def test_no_correct_rule_trace_is_flagged_for_using_a_rule_constant(text: str, formula: str, answer: str,
                                                                    steps: list[str]) -> None:
    out = _verify(_record(text, [{"type": "recomputation", "target": formula}], answer, steps))
    assert _grounding(out) == [("pass", [])], _grounding(out)
    # NOTE: grounded, yet the cited rule never ran: medium, for the rule's sake only.
    assert out.outcome.confidence == "medium" and out.evaluation.error_tags == [ANSWER_TAG]
