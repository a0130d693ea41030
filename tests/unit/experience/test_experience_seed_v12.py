"""The design's own v1.2 record (source 002, section 3.1), verbatim, through the HTTP API.

``SEED`` is the example record copied character for character from the design; a second record of
the same schema, written here, has checks code can execute. Both go in by ``POST /v1/experiences``
and come back from ``GET /v1/experiences/{id}?format=v1.2`` with every field they had.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from fastapi import FastAPI
from fastapi.testclient import TestClient

from recallserve.serve.api.errors import install_error_handlers
from recallserve.serve.experience import build_router

from .test_experience_v12 import get_tenant

A = {"Authorization": "Bearer key-a"}

SEED = json.loads(r"""{
  "version": "1.2",
  "metadata": {
    "id": "sem_20250828_abc123",
    "timestamp": "2025-08-28T14:22:35Z",
    "source_model": "qwen2-72b-instruct",
    "task_domain": "financial_compliance",
    "human_reviewer": "reviewer_id_789"
  },
  "segments": {
    "context": {
      "raw_text": "某银行发行理财产品A，募集规模50亿元，其中30亿元投资于国债，20亿元投资于企业债。根据《商业银行理财业务监督管理办法》第二十七条，非标资产投资余额不得超过理财产品净资产的35%。",
      "structured": {
        "quantities": [
          {"name": "total_fund", "value": 50, "unit": "billion_cny"},
          {"name": "govt_bond", "value": 30, "unit": "billion_cny"},
          {"name": "corp_bond", "value": 20, "unit": "billion_cny"}
        ],
        "constraints": [
          {"regulation": "CBIRC_Rule_27", "threshold": 0.35, "asset_type": "non_standard"}
        ]
      }
    },
    "reasoning": [
      {
        "step_id": 1,
        "text": "根据规则第二十七条，需计算非标资产占理财产品净资产的比例。",
        "principle": "regulatory_compliance_principle"
      },
      {
        "step_id": 2,
        "text": "企业债属于标准化债权类资产，不属于非标资产范畴。",
        "principle": "asset_classification_principle",
        "evidence": "《标准化债权类资产认定规则》第一条"
      },
      {
        "step_id": 3,
        "text": "因此非标资产余额为0，比例为0%，低于35%阈值。",
        "principle": "quantitative_comparison_principle"
      }
    ],
    "verification": [
      {
        "type": "regulatory_check",
        "target": "CBIRC_Rule_27",
        "status": "pass",
        "notes": "企业债明确排除在非标资产定义外"
      },
      {
        "type": "boundary_test",
        "input": {"non_standard_amount": 0},
        "expected": {"ratio": 0.0},
        "actual": 0.0,
        "status": "pass"
      }
    ],
    "outcome": {
      "answer": true,
      "confidence": "high",
      "explanation": "企业债不属于非标资产，故不违反比例限制"
    }
  },
  "evaluation": {
    "human_label": "correct",
    "error_tags": [],
    "retrieval_score": 0.92
  }
}""")

# A record of the same schema whose checks code can execute: the constraint names the quantity it
# bounds, and the boundary test gives its formula.
OWN = {
    "version": "1.2",
    "metadata": {"id": "sem_own_fund_b", "timestamp": "2025-09-01T08:00:00Z", "source_model": "qwen2-72b-instruct",
                 "task_domain": "financial_compliance", "human_reviewer": None},
    "segments": {
        "context": {
            "raw_text": "Wealth product B raised 40 billion CNY; 12 billion CNY is invested in non-standard assets. "
                        "Rule 27 caps non-standard assets at 35% of net assets.",
            "structured": {
                "quantities": [{"name": "total_fund", "value": 40, "unit": "billion_cny"},
                               {"name": "non_standard", "value": 12, "unit": "billion_cny"}],
                "constraints": [{"regulation": "CBIRC_Rule_27", "threshold": 0.35, "asset_type": "non_standard",
                                 "quantity": "non_standard / total_fund"}],
            },
        },
        "reasoning": [
            {"step_id": 1, "text": "The non-standard share is 12 / 40 = 0.3.", "principle": "quantitative_comparison_principle"},
            {"step_id": 2, "text": "0.3 is below the 0.35 cap, so the product complies.",
             "principle": "regulatory_compliance_principle", "evidence": "Rule 27"},
        ],
        "verification": [
            {"type": "regulatory_check", "target": "CBIRC_Rule_27", "status": "pass", "notes": "0.3 <= 0.35"},
            {"type": "boundary_test", "target": "non_standard / total_fund", "input": {"non_standard": 0},
             "expected": {"ratio": 0.0}, "actual": 0.0, "status": "pass"},
        ],
        "outcome": {"answer": True, "confidence": "high", "explanation": "30% is below the 35% cap"},
    },
    "evaluation": {"human_label": None, "error_tags": [], "retrieval_score": None},
}


@pytest.fixture
def client(make_service, clock):
    clock.t = 1756425600.0  # 2025-08-29T00:00:00Z: the day after the design's record
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(build_router(make_service(audit_share=0.0), get_tenant))
    with TestClient(app) as c:
        yield c


def _missing(sent: Any, got: Any, path: str = "") -> list[str]:
    """Paths of ``sent`` that ``got`` lacks or holds with another value (``got`` may add fields,
    and lists may gain items after those sent)."""
    if isinstance(sent, dict):
        if not isinstance(got, dict):
            return [path or "/"]
        return [p for k, v in sent.items() for p in ([f"{path}.{k}"] if k not in got else _missing(v, got[k], f"{path}.{k}"))]
    if isinstance(sent, list):
        if not isinstance(got, list) or len(got) < len(sent):
            return [path]
        return [p for i, v in enumerate(sent) for p in _missing(v, got[i], f"{path}[{i}]")]
    return [] if sent == got and type(sent) is type(got) or (
        isinstance(sent, (int, float)) and not isinstance(sent, bool) and not isinstance(got, bool) and sent == got) else [path]


def test_seed_record_verbatim_round_trips(client):
    r = client.post("/v1/experiences", json=SEED, headers=A)
    assert r.status_code == 201, r.text
    view = r.json()
    # A reviewer labelled it correct: reusable, whatever code could verify.
    assert view["tier"] == "active"
    out = client.get("/v1/experiences/sem_20250828_abc123", params={"format": "v1.2"}, headers=A).json()
    assert _missing(SEED, out) == []
    assert out["segments"]["outcome"]["answer"] is True
    # Neither check is executable (no formula, no bounded quantity): kept as stated, marked unverified,
    # and the confidence code derives is not high.
    seg = out["segments"]
    assert [(v["type"], v["status"], v["verified"]) for v in seg["verification"][:2]] == [
        ("regulatory_check", "pass", False), ("boundary_test", "pass", False)]
    assert seg["verification"][0]["check_notes"] and seg["outcome"]["verified_confidence"] != "high"
    # The export posts back unchanged (a fixed point).
    assert client.post("/v1/experiences", json=out, headers=A).status_code == 201
    again = client.get("/v1/experiences/sem_20250828_abc123", params={"format": "v1.2"}, headers=A).json()
    assert again == out


def test_seed_record_is_searchable(client):
    assert client.post("/v1/experiences", json=SEED, headers=A).status_code == 201
    hits = client.post("/v1/experiences/search", headers=A, json={
        "query": "CBIRC_Rule_27 non_standard threshold", "source_model": "qwen2-72b-instruct",
        "domain": "financial_compliance"}).json()["hits"]
    assert [h["experience"]["record"]["metadata"]["id"] for h in hits] == ["sem_20250828_abc123"]


def test_own_record_checks_are_executed(client):
    r = client.post("/v1/experiences", json=OWN, headers=A)
    assert r.status_code == 201, r.text
    out = client.get("/v1/experiences/sem_own_fund_b", params={"format": "v1.2"}, headers=A).json()
    assert _missing(OWN, out) == []
    reg, bound = out["segments"]["verification"][:2]
    assert reg["verified"] is True and reg["status"] == "pass" and reg["actual"] is True
    assert bound["verified"] is True and bound["status"] == "pass" and bound["actual"] == 0.0
    assert client.post("/v1/experiences", json=out, headers=A).status_code == 201
    assert client.get("/v1/experiences/sem_own_fund_b", params={"format": "v1.2"}, headers=A).json() == out


def test_executed_check_overrules_the_stated_status(client):
    doc = copy.deepcopy(OWN)
    doc["segments"]["context"]["structured"]["quantities"][1]["value"] = 16  # 16 / 40 = 0.4 > 0.35
    r = client.post("/v1/experiences", json=doc, headers=A)
    assert r.status_code == 201, r.text
    assert r.json()["tier"] == "review"
    reg = client.get("/v1/experiences/sem_own_fund_b", params={"format": "v1.2"}, headers=A).json()[
        "segments"]["verification"][0]
    assert reg["verified"] is True and reg["status"] == "fail" and reg["stated"]["status"] == "pass"


@pytest.mark.parametrize("answer", [True, 0.35, 7, "yes"])
def test_atomic_answers_of_any_scalar_type(client, answer):
    doc = copy.deepcopy(SEED)
    doc["segments"]["outcome"]["answer"] = answer
    assert client.post("/v1/experiences", json=doc, headers=A).status_code == 201
    got = client.get("/v1/experiences/sem_20250828_abc123", params={"format": "v1.2"}, headers=A).json()
    assert got["segments"]["outcome"]["answer"] == answer and type(got["segments"]["outcome"]["answer"]) is type(answer)


@pytest.mark.parametrize(("where", "value", "field"), [
    (("outcome", "answer"), {"x": 1}, "answer"),
    (("outcome", "answer"), [1], "answer"),
    (("context", "structured", "constraints"), [{"regulation": "R1", "colour": "red"}], "colour"),
    (("context", "structured", "quantities"), [{"name": "x", "value": "ten"}], "value"),
])
def test_bad_fields_name_the_field(client, where, value, field):
    doc = copy.deepcopy(SEED)
    node = doc["segments"]
    for k in where[:-1]:
        node = node[k]
    node[where[-1]] = value
    r = client.post("/v1/experiences", json=doc, headers=A)
    assert r.status_code == 400, r.text
    assert field in r.text


def _search_ids(c: TestClient, model: str) -> list[str]:
    r = c.post("/v1/experiences/search", headers=A, json={
        "query": "CBIRC_Rule_27 non_standard threshold", "source_model": model, "domain": "financial_compliance",
        "archival_k": 5})
    assert r.status_code == 200, r.text
    return [h["experience"]["record"]["metadata"]["id"] for h in r.json()["hits"] + r.json()["archival"]]


def test_a_72b_experience_is_not_reused_by_the_7b_model(client):
    """002: a qwen2-72b trace misled qwen2-7b; experiences move only between the same model."""
    assert client.post("/v1/experiences", json=SEED, headers=A).status_code == 201
    assert _search_ids(client, "qwen2-72b-instruct") == ["sem_20250828_abc123"]
    assert _search_ids(client, "models/Qwen2-72B-Instruct-Q4_K_M.gguf") == ["sem_20250828_abc123"]
    assert _search_ids(client, "qwen2-7b-instruct") == []


def test_a_family_named_in_config_shares_across_sizes(make_service, clock):
    clock.t = 1756425600.0
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(build_router(make_service(audit_share=0.0, shared_families=["qwen2"]), get_tenant))
    with TestClient(app) as c:
        assert c.post("/v1/experiences", json=SEED, headers=A).status_code == 201
        assert _search_ids(c, "qwen2-7b-instruct") == ["sem_20250828_abc123"]
        assert _search_ids(c, "llama-3-8b-instruct") == []
