"""Context cleaning (numbers, entities, question words) and the checks extracted from a context's
quantities, seen on the verified record and on what the embedder is given."""

from __future__ import annotations

import asyncio
import re
from collections.abc import Sequence

import numpy as np
import pytest

from serve.experience import ExperienceConfig, ExperienceRecord, ExperienceService, RuleTable, SearchRequest, verify_record
from serve.experience._clean import clean_context, extract_quantities, unify_numbers
from serve.experience._extract import SOURCE, extracted_checks

from .conftest import DIM

QWEN = "Qwen2.5-Coder-1.5B-Instruct"


@pytest.mark.parametrize("text", ["1.1 million", "1,100,000", "110万", "一百一十万", "1100 thousand", "1.1 Million",
                                  "0.011亿", "1100k"])
def test_number_forms_unify(text: str) -> None:
    assert unify_numbers(text) == "1100000"


@pytest.mark.parametrize(("text", "want"), [
    ("twenty five apples", "25 apples"), ("二十五个苹果", "25个苹果"), ("1.5万", "15000"), ("2亿", "200000000"),
    ("300K", "300K"), ("5 kg", "5 kg"), ("12,5", "12,5"),  # kelvin, a unit, and not a thousands group
])
def test_numerals_and_what_is_left_alone(text: str, want: str) -> None:
    assert unify_numbers(text) == want


def test_phrasings_of_one_problem_clean_alike() -> None:
    a = clean_context("What is the tax on the firm's revenue of $1,100,000?")
    b = clean_context("How much is the tax on the firm’s revenue of 1.1 million dollars")
    assert a == b == "the tax on the firm revenue of 1100000 usd"
    assert clean_context("一辆车在一点五小时内行驶了一百二十公里，速度是多少？") == "1辆车在1.5 h 内行驶了120 km 速度是"
    assert clean_context("The U.S. team scored") == "the us team scored"
    assert clean_context("A parameter is updated hourly") == "a parameter updated hourly"  # no unit inside words


def test_quantities_keep_case_sensitive_units() -> None:
    qs = extract_quantities(clean_context("A 2,000 W kettle runs for half an hour, then 0.5 hours at 300K.", fold_case=False))
    assert [(q.value, q.unit) for q in qs] == [(2000.0, "W"), (0.5, "h"), (300.0, "K")]


def _record(text: str, checks: list[dict], answer: str, quantities: Sequence[dict] = (),
            timestamp: float | None = None) -> ExperienceRecord:
    md = {"source_model": QWEN} | ({"timestamp": timestamp} if timestamp is not None else {})
    return ExperienceRecord.model_validate({
        "metadata": md, "context": {"raw_text": text, "quantities": list(quantities)},
        "reasoning": [{"step_id": 1, "text": "compute"}], "verification": checks, "outcome": {"answer": answer}})


def _verify(rec: ExperienceRecord) -> ExperienceRecord:
    return verify_record(rec, RuleTable([]), extract=True)


def test_extracted_checks_recompute_at_and_around_with_units() -> None:
    rec = _record("一辆车在一点五小时内行驶了一百二十公里，速度是多少？",
                  [{"type": "recomputation", "target": "120 / 1.5 = 80"}], "80 km/h")
    out = _verify(rec)
    extracted = [(v.type, v.target, v.status) for v in out.verification if v.input.get("source") == SOURCE]
    assert extracted == [
        ("recomputation", "120 / 1.5", "pass"), ("unit_check", "(120 km) / (1.5 h)", "pass"),  # 80 km/h
        ("boundary_test", "(118.8) / 1.5", "pass"), ("boundary_test", "(121.2) / 1.5", "pass"),
        ("boundary_test", "120 / (1.485)", "pass"), ("boundary_test", "120 / (1.515)", "pass")]
    assert out.outcome.confidence == "high" and out.evaluation.error_tags == []


def test_a_unit_mistake_only_the_extracted_check_sees() -> None:
    rec = _record("A car drives 120 km in 1.5 hours. Speed?", [{"type": "recomputation", "target": "120 / 1.5 = 80"}],
                  "80 m/s")
    assert verify_record(rec, RuleTable([])).outcome.confidence == "high"  # the model's own check passes
    out = _verify(rec)
    unit = next(v for v in out.verification if v.type == "unit_check")
    assert unit.status == "fail" and unit.actual == "22.2222 m/s"
    assert out.outcome.confidence == "low" and out.evaluation.error_tags == ["unit_mismatch"]


def test_an_ill_conditioned_formula_fails_around_its_quantities() -> None:
    rec = _record("Two readings: 100.5 and 100. Inverse of their gap?",
                  [{"type": "recomputation", "target": "1 / (100.5 - 100) = 2"}], "2")
    out = _verify(rec)
    around = [v.status for v in out.verification if v.type == "boundary_test"]
    assert around[:2] == ["fail", "fail"] and out.evaluation.error_tags == ["out_of_bounds"]


def test_no_extraction_without_a_formula_of_the_answer() -> None:
    # An intermediate recomputation (800 on the way to 950) is not the answer's formula.
    rec = _record("A worker earns 20 per hour for 40 hours plus 5 overtime hours at 1.5 times.",
                  [{"type": "recomputation", "target": "20 * 40 = 800"}], "950")
    assert extracted_checks(rec) == []
    # A number of unknown origin (9.5) could carry any unit: no unit check, the others stay.
    rec = _record("A car drives 120 km in 1.5 h.", [{"type": "recomputation", "target": "120 / 1.5 * 9.5 / 9.5"}],
                  "80 km/h")
    assert {v.type for v in extracted_checks(rec)} == {"recomputation", "boundary_test"}


def test_a_conversion_factor_leaves_the_dimension_to_check() -> None:
    rec = _record("A 2000 W kettle runs for 0.5 hours. Energy in kWh?",
                  [{"type": "recomputation", "target": "2000 * 0.5 / 1000 = 1"}], "1 kWh")
    unit = next(v for v in extracted_checks(rec) if v.type == "unit_check")
    assert (unit.target, unit.expected) == ("(2000 W) * (0.5 h) / 1000", "kWh")
    assert _verify(rec).outcome.confidence == "high"


def test_extracted_checks_share_the_records_budget() -> None:
    rec = _record("A car drives 120 km in 1.5 h.", [{"type": "recomputation", "target": "120 / 1.5 = 80"}], "80 km/h")
    out = verify_record(rec, RuleTable([]), extract=True, max_steps=100, seconds=10.0)
    statuses = [(v.input.get("source"), v.status) for v in out.verification]
    assert statuses[0] == (None, "pass")
    assert ("context", "fail") in statuses and out.outcome.confidence == "low"


def test_the_embedder_gets_cleaned_texts(tmp_path, clock) -> None:
    seen: list[str] = []

    def embed(texts: Sequence[str]) -> np.ndarray:
        seen.extend(texts)
        out = np.zeros((len(texts), DIM), dtype=np.float32)
        for i, t in enumerate(texts):
            for tok in re.findall(r"[a-z]+|\d+", t.lower()):
                out[i, hash(tok) % DIM] += 1.0
            out[i] /= max(float(np.linalg.norm(out[i])), 1e-9)
        return out

    svc = ExperienceService(ExperienceConfig(data_dir=tmp_path, min_similarity=0.1, audit_share=0.0), embed=embed,
                            clock=clock)
    rec = _record("What is the 10% tax on revenue of 1.1 million dollars?",
                  [{"type": "recomputation", "target": "0.1 * 1100000 = 110000"}], "110000", timestamp=clock.t)
    view = asyncio.run(svc.create("acme", rec))
    assert view.tier == "active"
    assert seen[-1].startswith("the 10% tax on revenue of 1100000 usd")
    hits = asyncio.run(svc.search("acme", SearchRequest(query="Tax of 10% on a revenue of $1,100,000?",
                                                        source_model=QWEN))).hits
    assert seen[-1] == "tax of 10% on a revenue of 1100000 usd"
    assert [h.experience.record.metadata.id for h in hits] == [view.record.metadata.id]
    svc.close()


@pytest.mark.parametrize("hybrid", [True, False])
def test_hybrid_search_finds_by_keyword_what_the_vector_misses(make_service, clock, hybrid) -> None:
    # NOTE: the test embedder sees letters only, so the order number is invisible to the vector side.
    # NOTE: recency weight 0 isolates the similarity term (both records are equally recent).
    svc = make_service(min_similarity=0.95, hybrid=hybrid, audit_share=0.0, recency_weight=0.0)
    ids = []
    for text in ("Shipping fee of order 77123 under SHIP-1?", "Shipping fee of a heavy parcel under SHIP-1?"):
        rec = _record(text, [{"type": "recomputation", "target": "4 + 1 = 5"}], "5", timestamp=clock.t)
        ids.append(asyncio.run(svc.create("acme", rec)).record.metadata.id)
    hits = asyncio.run(svc.search("acme", SearchRequest(query="What fee for order 77,123?", source_model=QWEN))).hits
    # Without keywords nothing passes the vector threshold; with them the order number decides.
    assert [h.experience.record.metadata.id for h in hits] == (ids if hybrid else [])
    if hybrid:
        assert hits[0].score > hits[1].score and all(h.similarity < 0.95 for h in hits)
