"""The design's v1.2 record JSON through the HTTP API: import, export, round trip, bad fields."""

from __future__ import annotations

import copy
from datetime import UTC, datetime

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient

from recallserve.serve.api.errors import install_error_handlers
from recallserve.serve.experience import ExperienceRecord, build_router
from recallserve.serve.experience._v12 import from_v12, to_v12

from ._records import speed_record

QWEN = "Qwen2.5-Coder-1.5B-Instruct"
A = {"Authorization": "Bearer key-a"}


async def get_tenant(authorization: str = Header(default="")) -> str:
    if authorization != "Bearer key-a":
        raise HTTPException(status_code=401, detail="invalid API key")
    return "acme"


@pytest.fixture
def client(make_service, clock):
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(build_router(make_service(audit_share=0.0), get_tenant))
    with TestClient(app) as c:
        c.clock = clock  # type: ignore[attr-defined]
        yield c


def _doc(clock) -> dict:
    iso = datetime.fromtimestamp(clock.t, tz=UTC).isoformat().replace("+00:00", "Z")
    return {
        "version": "1.2",
        "metadata": {"id": "exp_v12_speed", "timestamp": iso, "source_model": QWEN, "task_domain": "units",
                     "topic": "physics/speed", "human_reviewer": "ann", "expires_at": None},
        "segments": {
            "context": {"raw_text": "A car drives 120 km in 1.5 h. What is its speed?",
                        "quantities": [{"name": "d", "value": 120, "unit": "km"}], "constraints": []},
            "reasoning": [{"step_id": 1, "text": "divide distance by time", "principle": "v = d / t", "evidence": ""}],
            "verification": [{"type": "recomputation", "target": "d / 1.5", "expected": 80},
                             {"type": "unit_check", "target": "120 km / 1.5 h", "expected": "km/h"}],
            "outcome": {"answer": "80 km/h", "confidence": "high"},
        },
        "evaluation": {"human_label": None, "error_tags": [], "retrieval_score": None},
    }


def test_v12_import_export_round_trip(client):
    doc = _doc(client.clock)
    r = client.post("/v1/experiences", json=doc, headers=A)
    assert r.status_code == 201, r.text
    view = r.json()
    assert view["tier"] == "active" and view["record"]["metadata"]["timestamp"] == client.clock.t
    assert view["record"]["metadata"]["reviewer"] == "ann"
    out = client.get("/v1/experiences/exp_v12_speed", params={"format": "v1.2"}, headers=A).json()
    assert set(out) == {"version", "metadata", "segments", "evaluation"} and out["version"] == "1.2"
    assert out["metadata"] == doc["metadata"]
    seg, sent = out["segments"], doc["segments"]
    # The flat context of earlier releases is read; the export writes the design's `structured`.
    assert seg["context"] == {"raw_text": sent["context"]["raw_text"],
                              "structured": {"quantities": sent["context"]["quantities"], "constraints": []}}
    assert seg["reasoning"] == sent["reasoning"]
    assert seg["outcome"]["answer"] == "80 km/h" and seg["outcome"]["confidence"] == "high"
    # The checks as sent come first, executed by code; the extracted ones follow.
    own = seg["verification"][:2]
    assert [(v["type"], v["target"], v["status"]) for v in own] == [
        ("recomputation", "d / 1.5", "pass"), ("unit_check", "120 km / 1.5 h", "pass")]
    assert all(v["input"].get("source") == "context" for v in seg["verification"][2:])
    # Exported JSON imports back unchanged: a fixed point.
    assert client.post("/v1/experiences", json=out, headers=A).status_code == 201
    again = client.get("/v1/experiences/exp_v12_speed", params={"format": "v1.2"}, headers=A).json()
    assert again == out
    # The default view is unchanged.
    assert client.get("/v1/experiences/exp_v12_speed", headers=A).json()["record"]["metadata"]["id"] == "exp_v12_speed"


def test_conversion_is_lossless_both_ways(clock):
    rec = ExperienceRecord.model_validate(speed_record(timestamp=clock.t + 0.125, expires_at=clock.t + 86400,
                                                       exp_id="e1", label="correct"))
    back = from_v12(to_v12(rec))
    # NOTE: a check's status/actual/notes in the v1.2 form are a claim the verifier re-checks on
    # create: they come back as `stated`; the confidence as the stated one. The rest is unchanged.
    assert back.model_copy(update={"verification": rec.verification, "outcome": rec.outcome}) == rec
    assert [(v.type, v.target, v.expected) for v in back.verification] == [
        (v.type, v.target, v.expected) for v in rec.verification]
    assert [(v.stated.status, v.stated.actual) for v in back.verification] == [  # type: ignore[union-attr]
        (v.status, v.actual) for v in rec.verification]
    assert back.outcome.answer == rec.outcome.answer and back.outcome.stated_confidence == rec.outcome.confidence


@pytest.mark.parametrize(("edit", "param"), [
    (lambda d: d["metadata"].update(timestamp="yesterday"), "metadata.timestamp"),
    (lambda d: d["metadata"].update(timestamp="1969-12-31T23:59:59Z"), "metadata.timestamp"),
    (lambda d: d.update(version="1.1"), "version"),
    (lambda d: d["metadata"].update(topic="Not A Path!"), "metadata.topic"),
    (lambda d: d["segments"]["verification"][0].update(type="vibes"), "segments.verification.0.type"),
    (lambda d: d["segments"].pop("outcome"), "segments.outcome"),
    (lambda d: d["metadata"].update(reviewer="ann"), "metadata.reviewer"),  # the v1.2 name is human_reviewer
])
def test_bad_v12_fields_are_400_naming_the_field(client, edit, param):
    doc = copy.deepcopy(_doc(client.clock))
    edit(doc)
    r = client.post("/v1/experiences", json=doc, headers=A)
    assert r.status_code == 400, r.text
    assert r.json()["error"]["param"] == param, r.json()
