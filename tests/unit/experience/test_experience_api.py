"""The /v1/experiences routes through HTTP (TestClient on an app built here)."""

from __future__ import annotations

import pytest
from fastapi import FastAPI, Header, HTTPException
from fastapi.testclient import TestClient
from prometheus_client import generate_latest

from recallserve.serve.experience import build_router

from ._records import speed_record

KEYS = {"key-a": "acme", "key-b": "globex"}
QWEN = "Qwen2.5-Coder-1.5B-Instruct"


async def get_tenant(authorization: str = Header(default="")) -> str:
    key = authorization.removeprefix("Bearer ").strip()
    if key not in KEYS:
        raise HTTPException(status_code=401, detail="invalid API key")
    return KEYS[key]


@pytest.fixture
def client(make_service, clock):
    svc = make_service()
    app = FastAPI()
    app.include_router(build_router(svc, get_tenant))
    with TestClient(app) as c:
        c.clock = clock  # type: ignore[attr-defined]
        yield c


A = {"Authorization": "Bearer key-a"}
B = {"Authorization": "Bearer key-b"}


def test_create_get_search_and_tenant_scope(client):
    r = client.post("/v1/experiences", json=speed_record(timestamp=client.clock.t), headers=A)
    assert r.status_code == 201, r.text
    body = r.json()
    exp_id = body["record"]["metadata"]["id"]
    assert body["tier"] == "active" and body["record"]["outcome"]["confidence"] == "high"
    assert client.get(f"/v1/experiences/{exp_id}", headers=A).json()["record"]["metadata"]["id"] == exp_id
    assert client.get(f"/v1/experiences/{exp_id}", headers=B).status_code == 404
    assert client.get(f"/v1/experiences/{exp_id}").status_code == 401
    s = client.post("/v1/experiences/search", json={"query": "car speed km", "source_model": QWEN}, headers=A)
    assert s.status_code == 200 and [h["experience"]["record"]["metadata"]["id"] for h in s.json()["hits"]] == [exp_id]
    s_b = client.post("/v1/experiences/search", json={"query": "car speed km", "source_model": QWEN}, headers=B)
    assert s_b.json()["hits"] == []


def test_review_and_label_flow(client):
    low = client.post("/v1/experiences", json=speed_record(answer="95 km/h", timestamp=client.clock.t), headers=A)
    assert low.json()["tier"] == "review" and low.json()["record"]["outcome"]["confidence"] == "low"
    exp_id = low.json()["record"]["metadata"]["id"]
    queue = client.get("/v1/experiences/review", headers=A).json()
    assert [q["record"]["metadata"]["id"] for q in queue] == [exp_id]
    assert client.get("/v1/experiences/review", headers=B).json() == []
    assert client.post(f"/v1/experiences/{exp_id}/label", json={"label": "wrong"}, headers=B).status_code == 404
    r = client.post(f"/v1/experiences/{exp_id}/label",
                    json={"label": "wrong", "error_tags": ["arithmetic"], "note": "120/1.5 is 80"}, headers=A)
    assert r.status_code == 200, r.text
    assert r.json()["tier"] == "archival" and r.json()["record"]["evaluation"]["human_label"] == "wrong"
    assert client.get("/v1/experiences/review", headers=A).json() == []
    arch = client.post("/v1/experiences/search", headers=A, json={
        "source_model": QWEN, "error_tags": ["arithmetic"], "archival_k": 5}).json()["archival"]
    assert [a["experience"]["record"]["metadata"]["id"] for a in arch] == [exp_id]
    back = client.post(f"/v1/experiences/{exp_id}/label", json={"label": "correct"}, headers=A).json()
    assert back["tier"] == "active" and back["record"]["metadata"]["reviewer"] == "acme"


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/v1/experiences/x1/label", {"label": "maybe"}, "label"),
        ("/v1/experiences/x1/label", {"label": "wrong", "error_tags": ["bad tag!"]}, "error_tags"),
        ("/v1/experiences/x1/label", {"label": "wrong", "colour": "red"}, "colour"),
        ("/v1/experiences/search", {"query": "q"}, "source_model"),
        ("/v1/experiences/search", {"source_model": "m", "k": 0}, "k"),
    ],
)
def test_bad_input_is_422_naming_the_field(client, path, body, field):
    r = client.post(path, json=body, headers=A)
    assert r.status_code == 422
    assert any(field in [str(p) for p in d["loc"]] for d in r.json()["detail"]), r.json()


def test_bad_record_names_the_field(client):
    rec = speed_record()
    rec["metadata"]["topic"] = "Not A Path!"
    r = client.post("/v1/experiences", json=rec, headers=A)
    assert r.status_code == 422 and r.json()["detail"][0]["loc"][-1] == "topic"
    rec = speed_record()
    rec["verification"][0]["type"] = "vibes"
    r = client.post("/v1/experiences", json=rec, headers=A)
    assert r.status_code == 422 and "type" in r.json()["detail"][0]["loc"]
    assert client.get("/v1/experiences/review?limit=0", headers=A).status_code == 422
    assert client.post("/v1/experiences/x1/label", json={"label": "correct"}, headers=A).status_code == 404


def test_metrics_exposed_in_default_registry(client):
    client.post("/v1/experiences", json=speed_record(timestamp=client.clock.t), headers=A)
    text = generate_latest().decode()
    for name in ("recallserve_experience_cache_hit_rate", "recallserve_experience_verification_pass_rate",
                 "recallserve_experience_active_cache_freshness"):
        assert f"\n{name} " in text


def test_unverified_record_waits_in_review_and_is_not_found(client):
    """Review before reuse: a record without a failing check but not fully verified (medium) is
    not reusable until a reviewer labels it correct."""
    rec = speed_record(timestamp=client.clock.t)
    rec["verification"] = [{"type": "boundary_test", "target": "80"}]  # no bounds -> doubtful
    r = client.post("/v1/experiences", json=rec, headers=A)
    assert r.status_code == 201 and r.json()["record"]["outcome"]["confidence"] == "medium"
    assert r.json()["tier"] == "review"
    exp_id = r.json()["record"]["metadata"]["id"]
    search = {"query": "car speed km", "source_model": QWEN}
    assert client.post("/v1/experiences/search", json=search, headers=A).json()["hits"] == []
    assert client.post(f"/v1/experiences/{exp_id}/label", json={"label": "correct"}, headers=A).json()["tier"] == "active"
    hits = client.post("/v1/experiences/search", json=search, headers=A).json()["hits"]
    assert [h["experience"]["record"]["metadata"]["id"] for h in hits] == [exp_id]


def test_audit_sample_is_active_and_queued_until_labelled(make_service, clock):
    svc = make_service(audit_share=1.0)
    app = FastAPI()
    app.include_router(build_router(svc, get_tenant))
    with TestClient(app) as c:
        body = c.post("/v1/experiences", json=speed_record(timestamp=clock.t), headers=A).json()
        assert body["tier"] == "active" and body["record"]["evaluation"]["audit"] is True
        exp_id = body["record"]["metadata"]["id"]
        queue = c.get("/v1/experiences/review", headers=A).json()
        assert [(q["record"]["metadata"]["id"], q["tier"]) for q in queue] == [(exp_id, "active")]
        assert c.get("/v1/experiences/review", headers=B).json() == []
        assert c.post(f"/v1/experiences/{exp_id}/label", json={"label": "correct"}, headers=A).json()["tier"] == "active"
        assert c.get("/v1/experiences/review", headers=A).json() == []


def test_audit_share_draws_about_the_configured_share():
    from recallserve.serve.experience._service import audit_pick

    drawn = sum(audit_pick("acme", f"exp_{i:06d}", 0.05) for i in range(4000))
    assert 140 <= drawn <= 260  # 5% of 4000 = 200, binomial sd ~14: +-4 sd
    assert not any(audit_pick("acme", f"exp_{i}", 0.0) for i in range(100))
