"""Grounded verification (issue 19): a pass reaches the active cache only when tied to the problem.

Two holes of ``recallserve eval experiences``, each tested where the user meets it: the tier and
confidence ``POST /v1/experiences`` answers, and the rows ``recallserve eval experiences --replay``
writes.

* the model's own equation: "Solve for x: 3x + 7 = 25." answered 6 by the back-substitution
  ``3x = 18`` (shipped a4 and a8 went active); only a substitution into the stated equation, or a
  check that computed 18 from the stated numbers, ties 6 to the problem;
* a number of unknown origin in a formula: its extracted unit check is off (the unit of the number
  is unknown), so ``90 / 1.5 = 60 m/s`` passed every check (held-out g3 with E-CoT).

Such passes are kept (status ``pass``, counted in the pass rate) with a note naming the numbers of
unknown origin, and the trace waits in review with the tag ``ungrounded_check``.
"""

from __future__ import annotations

import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from recallserve.serve.experience import build_router

QWEN = "Qwen2.5-Coder-1.5B-Instruct"
EQUATION = "Solve for x: 3x + 7 = 25."
TANK = "A tank holds 240 liters and is 35% full. How many liters are in it?"
SPEED = "A car travels at 90 km/h on a highway. What is its speed in m/s?"


async def _tenant() -> str:
    return "acme"


@pytest.fixture
def client(make_service, clock):
    app = FastAPI()
    app.include_router(build_router(make_service(audit_share=0.0), _tenant))
    with TestClient(app) as c:
        c.clock = clock  # type: ignore[attr-defined]
        yield c


def _post(client: TestClient, text: str, checks: list[dict[str, Any]], answer: str) -> dict[str, Any]:
    body = {"metadata": {"source_model": QWEN, "task_domain": "arithmetic", "timestamp": client.clock.t},  # type: ignore[attr-defined]
            "context": {"raw_text": text}, "reasoning": [{"step_id": 1, "text": "solve"}],
            "verification": checks, "outcome": {"answer": answer, "confidence": "high"}}
    r = client.post("/v1/experiences", json=body)
    assert r.status_code == 201, r.text
    return r.json()


def _filed(view: dict[str, Any]) -> tuple[str, str, list[str]]:
    return view["tier"], view["record"]["outcome"]["confidence"], view["record"]["evaluation"]["error_tags"]


@pytest.mark.parametrize(("text", "equation", "answer", "unknown"), [
    (EQUATION, "3x = 18", "6", "18"),  # shipped a4
    ("Solve for y: 5y - 9 = 11.", "5y = 20", "4", "20"),  # shipped a8
    ("Solve for x: 4x + 6 = 30.", "1.5x = 9", "6", "1.5, 9"),  # a coefficient written against its unknown
])
def test_a_back_substitution_into_the_models_own_equation_waits_in_review(client, text: str, equation: str,
                                                                          answer: str, unknown: str) -> None:
    view = _post(client, text, [{"type": "back_substitution", "target": equation},
                                {"type": "boundary_test", "target": answer, "expected": "[0, 10]"}], answer)
    assert _filed(view) == ("review", "medium", ["ungrounded_check"])
    own = view["record"]["verification"][0]
    # NOTE: recorded, not failed: the answer does satisfy the model's equation; only its numbers are not the problem's.
    assert own["status"] == "pass" and own["notes"].endswith(f"; not grounded: {unknown} of unknown origin")
    assert client.get("/v1/experiences/review").json()[0]["record"]["metadata"]["id"] == view["record"]["metadata"]["id"]


@pytest.mark.parametrize("checks", [
    [{"type": "back_substitution", "target": "3*x + 7 = 25"}],  # into the stated equation
    [{"type": "recomputation", "target": "25 - 7 = 18"},  # 18 computed from the stated numbers first
     {"type": "back_substitution", "target": "3x = 18"}],
])
def test_a_back_substitution_tied_to_the_stated_equation_is_active(client, checks: list[dict[str, Any]]) -> None:
    view = _post(client, EQUATION, checks, "6")
    assert _filed(view) == ("active", "high", [])
    assert not any("not grounded" in v["notes"] for v in view["record"]["verification"])


@pytest.mark.parametrize(("text", "formula", "answer", "unknown"), [
    (TANK, "240 * 0.35 * 1.2 = 100.8", "100.8 liters", "1.2"),
    (SPEED, "90 / 1.5 = 60", "60 m/s", "1.5"),
])
def test_a_number_of_unknown_origin_keeps_a_passing_formula_out_of_the_active_cache(
        client, text: str, formula: str, answer: str, unknown: str) -> None:
    view = _post(client, text, [{"type": "recomputation", "target": formula}], answer)
    tier, confidence, tags = _filed(view)
    assert (tier, confidence) == ("review", "medium") and "ungrounded_check" in tags
    checks = view["record"]["verification"]
    # NOTE: every check code derived from the problem passes too: the unit check is off for an
    # unknown number, the recomputation and the grounding check agree with the formula.
    assert all(v["status"] == "pass" for v in checks), [(v["type"], v["status"], v["notes"]) for v in checks]
    assert not any(v["type"] == "unit_check" and v["input"].get("source") == "context" and not v["input"].get("asked")
                   for v in checks)
    assert checks[0]["notes"].endswith(f"; not grounded: {unknown} of unknown origin")


@pytest.mark.parametrize(("text", "formula", "answer"), [
    (TANK, "240 * 0.35 = 84", "84 liters"),  # 35% read as 0.35
    (TANK, "240 * 35 / 100 = 84", "84 liters"),
    (SPEED, "90 / 3.6 = 25", "25 m/s"),  # the km/h -> m/s factor
    (SPEED, "90 * 1000 / 3600 = 25", "25 m/s"),
    ("A printer prints 45 pages in 3 minutes. How many pages in 2 hours?", "45 / 3 * 120 = 1800", "1800"),  # 2 h in min
])
def test_a_formula_of_stated_quantities_and_known_factors_is_active(client, text: str, formula: str,
                                                                    answer: str) -> None:
    view = _post(client, text, [{"type": "recomputation", "target": formula}], answer)
    assert _filed(view) == ("active", "high", [])


def test_a_chain_of_grounded_steps_is_grounded_and_a_broken_link_is_not(client) -> None:
    text = "A price of 50 is raised by 20%. The new price is then cut by 10%. What is the final price?"
    chain = [{"type": "recomputation", "target": "50 * 1.2 = 60"}, {"type": "recomputation", "target": "60 * 0.9 = 54"}]
    assert _filed(_post(client, text, chain, "54")) == ("active", "high", [])
    # NOTE: the same last step without the check that computed 60: 60 is of unknown origin.
    assert _filed(_post(client, text, chain[1:], "54"))[:2] == ("review", "medium")


# The eval: stored replies filed again by the current rules, as `--replay` does for the result files.

A4_REPLY = ("Context: 3x + 7 = 25\nReasoning:\n1. Subtract 7 from both sides: 3x + 7 - 7 = 25 - 7\nVerification:\n"
            "- recomputation: 3x = 18\n- unit_check: 3x = 18 -> x\n- back_substitution: 3x = 18 -> x = 6\n"
            "- boundary_test: 6 in [0, 10]\nOutcome: 6\nConfidence: high")  # shipped a4's reply, as stored
A4_GROUNDED = A4_REPLY.replace("back_substitution: 3x = 18 -> x = 6", "back_substitution: 3*x + 7 = 25 -> x = 6")


@pytest.mark.slow
@pytest.mark.parametrize(("reply", "tier", "tags"), [
    (A4_REPLY, "review", ["ungrounded_check"]),
    (A4_GROUNDED, "active", []),
])
def test_the_eval_replay_files_a4_by_whether_its_check_is_grounded(tmp_path, reply: str, tier: str,
                                                                   tags: list[str]) -> None:
    from recallserve.deployments.cli import main

    rows = [{"id": "a4", "mode": m, "condition": c, "raw_text": reply} for m in ("after", "before")
            for c in ("with", "without")]
    stored = tmp_path / "run.json"
    stored.write_text(json.dumps({"model": "m", "rows": rows}))
    out = tmp_path / "replay.json"
    assert main(["eval", "experiences", "--replay", str(stored), "--ids", "a4", "--out", str(out)]) == 0
    after = [r for r in json.loads(out.read_text())["rows"] if r["mode"] == "after"]
    assert [(r["correct"], r["tier"], r["error_tags"]) for r in after] == [(True, tier, tags)] * 2
