"""Each verification template executed by code, the rule table, and derived confidence."""

from __future__ import annotations

import pytest

from recallserve.serve.experience import (
    ExperienceContext,
    ExperienceMetadata,
    ExperienceOutcome,
    ExperienceRecord,
    Quantity,
    Rule,
    RuleError,
    RuleTable,
    VerificationItem,
    derive_confidence,
    run_check,
    verify_record,
)

RULES = RuleTable([
    Rule(id="OT-1", description="Hours over 40 paid 1.5x", expression="40*rate + 1.5*rate*max(0, hours-40)",
         variables=["rate", "hours"]),
    Rule(id="SPEED-URBAN", description="Urban speed at most 50 km/h", expression="speed <= 50", variables=["speed"]),
])


def check(**kw) -> VerificationItem:
    return run_check(VerificationItem(**kw), RULES, answer=kw.pop("answer", None) if "answer" in kw else None)


@pytest.mark.parametrize(
    ("item", "status"),
    [
        (dict(type="recomputation", target="120/1.5", expected="80"), "pass"),
        (dict(type="recomputation", target="100/3 = 33.3"), "doubtful"),  # rounding only
        (dict(type="recomputation", target="2+2", expected=5), "fail"),
        (dict(type="recomputation", target="2+2"), "doubtful"),  # nothing to compare with
        (dict(type="recomputation", target="open('x')", expected=1), "not_run"),  # not executable
        (dict(type="unit_check", target="120 km / 1.5 h", expected="km/h"), "pass"),
        (dict(type="unit_check", target="120 km / 1.5 h", expected="80 km/h"), "pass"),
        (dict(type="unit_check", target="120 km / 1.5 h", expected="90 km/h"), "fail"),
        (dict(type="unit_check", target="120 km * 1.5 h", expected="km/h"), "fail"),  # dimension
        (dict(type="unit_check", target="1 m + 2 s", expected="m"), "fail"),
        (dict(type="unit_check", target="5 km", expected="parsecs"), "not_run"),  # no unit to check against
        (dict(type="back_substitution", target="2*x + 3 = 11", input={"x": 4}), "pass"),
        (dict(type="back_substitution", target="2*x + 3 = 11", expected="x = 5"), "fail"),
        (dict(type="back_substitution", target="2*x + 3", input={"x": 4}), "not_run"),  # no '=': no equation
        (dict(type="boundary_test", target="0.3", expected="0 <= p <= 1"), "pass"),
        (dict(type="boundary_test", target="120/1.5", input={"max": 50}), "fail"),
        (dict(type="boundary_test", target="0", input={"min": 0, "inclusive": False}), "fail"),
        (dict(type="boundary_test", target="7", expected="between 1 and 10"), "pass"),
        (dict(type="boundary_test", target="0.5", expected="0..1"), "pass"),
        (dict(type="boundary_test", target="-1", expected=">= 0"), "fail"),
        (dict(type="boundary_test", target="3"), "doubtful"),  # no bounds
        (dict(type="regulatory_check", target="OT-1", input={"rate": 20, "hours": 45}, expected="$950"), "pass"),
        (dict(type="regulatory_check", target="ot_1", input={"rate": 20, "hours": 45}, expected=900), "fail"),
        (dict(type="regulatory_check", target="SPEED-URBAN", input={"speed": 60}, expected="violation"), "pass"),
        (dict(type="regulatory_check", target="SPEED-URBAN", input={"speed": 60}), "fail"),  # condition must hold
        (dict(type="regulatory_check", target="X-9"), "doubtful"),  # unknown rule
        (dict(type="regulatory_check", target="OT-1", input={"rate": 20}, expected=950), "doubtful"),  # missing input
    ],
)
def test_templates(item, status):
    out = run_check(VerificationItem(**item), RULES)
    assert out.status == status, out.notes


def test_model_claims_are_not_trusted():
    out = run_check(VerificationItem(type="recomputation", target="2+2", expected=5, actual=5, status="pass"), RULES)
    assert (out.status, out.actual) == ("fail", 4.0)


def test_answer_is_the_default_expectation_and_context_variables_are_usable():
    out = run_check(VerificationItem(type="recomputation", target="d / t"), RULES, variables={"d": 120, "t": 1.5},
                    answer="80 km/h")
    assert out.status == "pass"
    out = run_check(VerificationItem(type="back_substitution", target="1.5*v = 120"), RULES, answer="80")
    assert out.status == "pass"


def test_rule_table_registration_errors():
    with pytest.raises(ValueError, match="already registered"):
        RuleTable([RULES.get("OT-1"), RULES.get("ot-1")])
    with pytest.raises(ValueError, match="expression"):
        RuleTable([Rule(id="BAD", description="d", expression="rate +", variables=["rate"])])
    with pytest.raises(ValueError, match="rule id"):
        Rule(id="bad id!", description="d", expression="1")
    with pytest.raises(RuleError, match="'NOPE' is not registered"):
        RULES.get("NOPE")
    assert RULES.evaluate("OT-1", {"RATE": "20", "hours": 40}) == 800.0


@pytest.mark.parametrize(
    ("statuses", "conf"),
    [(["pass", "pass"], "high"), (["pass", "doubtful"], "medium"), ([], "medium"),
     (["pass", "not_run"], "high"), (["not_run"], "medium"), (["not_run", "fail"], "low"),
     (["pass", "doubtful", "fail"], "low")],
)
def test_derive_confidence(statuses, conf):
    assert derive_confidence(statuses) == conf


def _record(checks, answer="80 km/h", stated="high") -> ExperienceRecord:
    return ExperienceRecord(
        metadata=ExperienceMetadata(source_model="m"),
        context=ExperienceContext(raw_text="120 km in 1.5 h", quantities=[Quantity(name="d", value=120, unit="km")]),
        verification=[VerificationItem(**c) for c in checks],
        outcome=ExperienceOutcome(answer=answer, confidence=stated),
    )


def test_verify_record_derives_confidence_and_keeps_the_stated_one():
    rec = verify_record(_record([dict(type="recomputation", target="d / 1.5"),
                                 dict(type="unit_check", target="120 km / 1.5 h")]), RULES)
    assert [v.status for v in rec.verification] == ["pass", "pass"]
    assert (rec.outcome.confidence, rec.outcome.stated_confidence) == ("high", "high")
    bad = verify_record(_record([dict(type="recomputation", target="d / 2")]), RULES)
    assert bad.outcome.confidence == "low"


def test_required_checks_missing_make_it_doubtful():
    rec = verify_record(_record([dict(type="recomputation", target="120/1.5")]), RULES,
                        required=["recomputation", "unit_check"])
    assert [(v.type, v.status) for v in rec.verification] == [("recomputation", "pass"), ("unit_check", "doubtful")]
    assert rec.outcome.confidence == "medium"
