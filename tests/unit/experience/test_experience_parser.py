"""Tolerant parsing of segmented reasoner output: json, separators, headings, keywords."""

from __future__ import annotations

import pytest

from recallserve.serve.experience import ExperienceMetadata, parse_segmented
from recallserve.serve.experience._parser import parse_verification_line

JSON_FENCED = """Sure, here it is:
```json
{"context": {"facts": ["A car drives 120 km in 1.5 h"],
             "quantities": [{"name": "d", "value": 120, "unit": "km"}, {"name": "t", "value": 1.5, "unit": "h"}],
             "constraints": ["speed must be positive"]},
 "reasoning": [{"step_id": 1, "text": "speed = d / t", "principle": "v = d/t", "evidence": "given"}],
 "verification": [{"type": "recomputation", "target": "120/1.5", "expected": 80},
                  {"type": "unit_check", "target": "120 km / 1.5 h", "expected": "km/h"}],
 "outcome": {"answer": "80 km/h", "confidence": "high", "explanation": "distance over time"}}
```
Hope this helps."""

SEPARATORS = """Context
120 km in 1.5 hours; distance = 120 km
---
Reasoning
1. Speed is distance over time. Principle: v = d/t
2. 120/1.5 = 80
---
Verification
- recomputation: 120/1.5 = 80
- unit check: 120 km / 1.5 h -> km/h (pass)
---
Outcome
Answer: 80 km/h
Confidence: high"""

HEADINGS = """## 1. Context
The worker worked 45 hours at 20 per hour.
## 2. Reasoning
Step 1: overtime beyond 40 h is paid 1.5x [principle: OT-1]
Given the rule, pay = 40*20 + 5*30.
## 3. Verification
1. back substitution: 1.5*v = 120 with v = 80
2. boundary test: 950 in [0, 2000]
3. rule check: OT-1 with rate=20, hours=45 -> 950
## 4. Outcome
**950**
Confidence: medium"""

KEYWORDS = "Context: 2 apples and 3 more. Reasoning: add them. Verification: recompute: 2+3 = 5. Answer: 5 apples"


def test_json_fenced_with_prose():
    t = parse_segmented(JSON_FENCED)
    assert t.report.format == "json" and t.report.ok and t.report.problems == []
    assert [q.name for q in t.quantities] == ["d", "t"] and t.quantities[1].unit == "h"
    assert t.constraints == ["speed must be positive"]
    assert t.reasoning[0].principle == "v = d/t" and t.reasoning[0].evidence == "given"
    assert [(v.type, v.target, v.expected) for v in t.verification] == [
        ("recomputation", "120/1.5", 80), ("unit_check", "120 km / 1.5 h", "km/h")]
    assert (t.answer, t.confidence, t.explanation) == ("80 km/h", "high", "distance over time")


def test_broken_json_is_repaired():
    text = '{"context": "120 km in 1.5 h", "reasoning": ["divide"], "verification": ["recomputation: 120/1.5 = 80"], "outcome": {"answer": "80 km/h", "confidence": "high"'
    t = parse_segmented(text)
    assert t.report.format == "json" and t.report.ok
    assert t.verification[0].type == "recomputation" and t.answer == "80 km/h"


def test_json_aliases_and_unreadable_items_are_reported():
    text = '{"facts": ["x"], "steps": ["a", "b"], "checks": [{"type": "astrology", "target": "1"}, "nonsense"], "answer": 42}'
    t = parse_segmented(text)
    assert t.report.format == "json" and t.report.ok
    assert [s.text for s in t.reasoning] == ["a", "b"] and t.answer == "42"
    assert t.verification == []
    assert any("verification[1]: unknown check type 'astrology'" in p for p in t.report.problems)
    assert any("verification[2]" in p for p in t.report.problems)


def test_separators():
    t = parse_segmented(SEPARATORS)
    assert t.report.format == "separators" and t.report.ok
    assert t.quantities[0].name == "distance" and t.quantities[0].value == 120
    assert [s.principle for s in t.reasoning] == ["v = d/t", ""]
    assert [(v.type, v.expected) for v in t.verification] == [("recomputation", None), ("unit_check", "km/h")]
    assert (t.answer, t.confidence) == ("80 km/h", "high")


def test_numbered_markdown_headings():
    t = parse_segmented(HEADINGS)
    assert t.report.format == "headings" and t.report.ok
    # "Given the rule, ..." opens a sentence, not a new section.
    assert len(t.reasoning) == 2 and t.reasoning[0].principle == "OT-1"
    types = [(v.type, v.target, v.input, v.expected) for v in t.verification]
    assert types == [
        ("back_substitution", "1.5*v = 120", {"v": 80.0}, None),
        ("boundary_test", "950", {}, "[0, 2000]"),
        ("regulatory_check", "OT-1", {"rate": 20.0, "hours": 45.0}, "950"),
    ]
    assert (t.answer, t.confidence) == ("950", "medium")


def test_inline_keywords_fallback():
    t = parse_segmented(KEYWORDS)
    assert t.report.format == "keywords" and t.report.ok
    assert t.answer == "5 apples" and t.verification[0].type == "recomputation"


def test_partial_and_garbage_report_what_is_missing():
    t = parse_segmented("Reasoning: add\nAnswer: 5")
    assert not t.report.ok and t.answer == "5"
    assert "missing segments: context, verification" in t.report.problems
    g = parse_segmented("I think it is five.")
    assert g.report.format == "none" and not g.report.ok and g.answer is None
    assert "no answer found" in g.report.problems


def test_to_record_builds_a_valid_record_or_refuses_without_answer():
    t = parse_segmented(JSON_FENCED)
    rec = t.to_record("A car drives 120 km in 1.5 h. Speed?", ExperienceMetadata(source_model="m"))
    assert rec.outcome.stated_confidence == "high" and rec.context.raw_text.startswith("A car")
    with pytest.raises(ValueError, match="no answer"):
        parse_segmented("nothing").to_record("q", ExperienceMetadata(source_model="m"))


@pytest.mark.parametrize(
    ("line", "typ", "target", "expected"),
    [
        ("Recalculate: 3*4 = 12 ✓", "recomputation", "3*4 = 12", None),
        ("dimension check: 10 N * 2 m => J", "unit_check", "10 N * 2 m", "J"),
        ("Range check: 0.4 within 0..1", "boundary_test", "0.4", "0..1"),
        ("compliance: SPEED-1 with speed=60 expected: violation", "regulatory_check", "SPEED-1", "violation"),
    ],
)
def test_verification_line_variants(line, typ, target, expected):
    item = parse_verification_line(line)
    assert item is not None and (item.type, item.target, item.expected) == (typ, target, expected)


def test_verification_line_without_type_is_none():
    assert parse_verification_line("looks fine to me") is None


def test_the_prompt_example_parses_and_verifies():
    from recallserve.serve.experience import RuleTable, verify_record
    from recallserve.serve.experience._prompt import SYSTEM_PROMPT

    example = SYSTEM_PROMPT.split("Example:\n", 1)[1]
    t = parse_segmented(example)
    assert t.report.ok and t.report.format == "headings" and t.report.problems == []
    assert (t.answer, t.confidence) == ("80 km/h", "high")
    assert t.reasoning[0].principle == "v = d / t" and t.reasoning[0].text == "speed = 120 / 1.5 = 80"
    # NOTE: the example's numbers must be the question's: a check is grounded only in stated quantities.
    question = "A car drives 120 km in 1.5 h. What is its speed in km/h?"
    rec = verify_record(t.to_record(question, ExperienceMetadata(source_model="m")), RuleTable())
    assert [(v.type, v.status) for v in rec.verification] == [
        ("recomputation", "pass"), ("unit_check", "pass"), ("boundary_test", "pass")]
    assert rec.outcome.confidence == "high"


def test_inline_confidence_is_taken_out_of_the_answer():
    t = parse_segmented("Context: x\nReasoning:\n1. a\nVerification:\n- recomputation: 1+1 = 2\n"
                        "Outcome: 2 apples [confidence: medium]")
    assert (t.answer, t.confidence, t.report.ok) == ("2 apples", "medium", True)
