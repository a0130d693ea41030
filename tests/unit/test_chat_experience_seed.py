"""002's prompt rules, seen in the prompt the engine receives, and its record shape in a reply.

A scripted engine stands in for the reasoner. The design's own example record (reviewer-approved,
Medium by code: neither of its checks can be executed) is posted through the HTTP API under the
engine's model; the next segmented turn's prompt must ask for two or more checks, name the rule
the injected experience checked, and carry the Medium warning. A reply written in the design's
JSON shape is read with its structured context and its checks' stated results.
"""

from __future__ import annotations

import copy
import json
import time
from typing import Any

from fastapi.testclient import TestClient

from tests.unit.agent.conftest import ScriptedEngine
from tests.unit.experience.test_experience_seed_v12 import OWN, SEED
from tests.unit.test_chat_experience_review import H, rig  # noqa: F401 - the scripted-engine rig fixture

Q = "Product C raised 60 billion CNY, 25 billion CNY in non-standard assets. Does it comply with CBIRC_Rule_27?"


def _turn(c: TestClient, engine: ScriptedEngine, reply: str) -> tuple[dict[str, Any], str]:
    engine.replies.append(reply)
    r = c.post("/v1/chat/completions", headers=H, json={
        "model": "recallserve", "max_tokens": 256, "messages": [{"role": "user", "content": Q}],
        "metadata": {"reasoning": "segmented", "task_domain": "financial_compliance"}})
    assert r.status_code == 200, r.text
    return r.json()["recallserve"]["experience"], "\n".join(m.content for m in engine.calls[-1][0])


def _seed_for(engine: ScriptedEngine) -> dict[str, Any]:
    doc = copy.deepcopy(SEED)
    doc["metadata"]["source_model"] = engine.model_name
    doc["metadata"].pop("timestamp")  # now: inside the 30-day window
    return doc


def test_prompt_asks_two_checks_names_the_rule_and_warns_of_medium(rig: Any) -> None:
    c, engine = rig
    r = c.post("/v1/experiences", headers=H, json=_seed_for(engine))
    assert r.status_code == 201 and r.json()["tier"] == "active" and r.json()["record"]["outcome"]["confidence"] == "medium"
    meta, prompt = _turn(c, engine, json.dumps(SEED["segments"], ensure_ascii=False))
    assert meta["injected"] == ["sem_20250828_abc123"]
    assert "at least two checks" in prompt
    assert "Your verification must include: regulatory_check (target CBIRC_Rule_27), boundary_test." in prompt
    assert "Warning: past problem 1 is only Medium confidence: regulatory_check CBIRC_Rule_27" in prompt
    assert "企业债明确排除在非标资产定义外" in prompt  # the check's notes, as the reviewer-approved record states them


def test_a_reply_in_the_design_shape_keeps_its_structure_and_stated_results(rig: Any) -> None:
    c, engine = rig
    meta, prompt = _turn(c, engine, json.dumps(SEED["segments"], ensure_ascii=False))
    assert "Warning:" not in prompt and meta["parsed"] is True
    # Unverifiable checks: kept as stated, unverified; the trace waits for a reviewer.
    assert meta["tier"] == "review" and meta["confidence"] == "medium"
    out = c.get(f"/v1/experiences/{meta['id']}", params={"format": "v1.2"}, headers=H).json()
    seg = out["segments"]
    assert seg["context"]["structured"]["constraints"][0]["regulation"] == "CBIRC_Rule_27"
    assert [q["name"] for q in seg["context"]["structured"]["quantities"]] == ["total_fund", "govt_bond", "corp_bond"]
    assert [(v["type"], v["status"], v["verified"]) for v in seg["verification"][:2]] == [
        ("regulatory_check", "pass", False), ("boundary_test", "pass", False)]
    assert seg["verification"][1]["expected"] == {"ratio": 0.0} and seg["verification"][1]["actual"] == 0.0
    assert seg["outcome"]["answer"] == "true"


def test_three_experiences_are_injected_newest_record_first(rig: Any) -> None:
    """002: top 3 of the active cache, time first: by each record's own time, not its last use."""
    c, engine = rig
    now = time.time()
    for i, age_days in enumerate([5, 1, 3, 2]):
        doc = copy.deepcopy(OWN)
        doc["metadata"].update(id=f"fund_{i}", source_model=engine.model_name,
                               timestamp=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(now - age_days * 86400)),
                               human_reviewer="ann")
        doc["evaluation"]["human_label"] = "correct"
        r = c.post("/v1/experiences", headers=H, json=doc)
        assert r.status_code == 201 and r.json()["tier"] == "active", r.text
    meta, prompt = _turn(c, engine, json.dumps(SEED["segments"], ensure_ascii=False))
    assert meta["injected"] == ["fund_1", "fund_3", "fund_2"]
    assert prompt.count("- Problem:") == 3
    # Retrieved together just now, they keep their order: recency is the record's time.
    meta, _ = _turn(c, engine, json.dumps(SEED["segments"], ensure_ascii=False))
    assert meta["injected"] == ["fund_1", "fund_3", "fund_2"]
