"""The parts of a request outside its body are one value each, and each one is read.

A query parameter sent twice was answered with its last value, and one the route does not take
(``/v1/turns?sessionid=s1``) was dropped, so an unfiltered list came back looking filtered; two
``Authorization`` headers were resolved by taking the first (which one a proxy forwards first
decides the tenant). Each is now a 4xx naming it.
"""

from __future__ import annotations

from typing import Any

import pytest

from tests.security.conftest import Rig
from tests.unit.edge.conftest import assert_envelope, headers

_MEMORY = {"memories": [{"text": "ticket T-88: grinder jammed", "source_id": "doc:1"}]}


@pytest.mark.parametrize(("url", "param"), [
    ("/v1/memories?source_id=doc:1&source_id=doc:2", "source_id"),
    ("/v1/turns?limit=5&limit=50", "limit"),
    ("/v1/sessions/s1?user=u1&user=u2", "user"),
    ("/v1/experiences/review?limit=1&limit=2", "limit"),
])
def test_a_repeated_query_parameter_is_400(shared_rig: Rig, url: str, param: str) -> None:
    error = assert_envelope(shared_rig.client.get(url, headers=headers("acme")), 400, param)
    assert error["message"].startswith(f"{param}: ")


@pytest.mark.parametrize(("method", "url", "param"), [
    ("GET", "/v1/turns?sessionid=s1", "sessionid"),
    ("GET", "/v1/memories?source_id=doc:1&sourceid=doc:2", "sourceid"),
    ("GET", "/v1/models?x=1", "x"),
    ("POST", "/v1/chat/completions?stream=true", "stream"),
])
def test_a_query_parameter_the_route_does_not_take_is_400(shared_rig: Rig, method: str, url: str, param: str) -> None:
    body = {"model": "recallserve", "messages": [{"role": "user", "content": "hi"}]} if method == "POST" else None
    error = assert_envelope(shared_rig.client.request(method, url, json=body, headers=headers("acme")), 400, param)
    assert param in error["message"], error


def test_the_declared_parameters_still_work(shared_rig: Rig) -> None:
    """The positive control, and routes outside the API (liveness, scrape, an unknown /v1 path)."""
    assert shared_rig.client.post("/v1/memories", json=_MEMORY, headers=headers("acme")).status_code == 200
    got = shared_rig.client.get("/v1/memories?source_id=doc:1", headers=headers("acme"))
    assert got.status_code == 200 and len(got.json()["data"]) == 1, got.text
    assert shared_rig.client.get("/v1/turns?session_id=s1&limit=5&before=1700000000", headers=headers("acme")).status_code == 200
    assert shared_rig.client.get("/healthz?probe=1").status_code == 200
    assert shared_rig.client.get("/metrics?name[]=x").status_code == 200
    assert_envelope(shared_rig.client.get("/v1/no-such-route?x=1", headers=headers("acme")), 404)


@pytest.mark.parametrize("pair", [("Bearer sk-globex", "Bearer sk-acme"), ("Bearer sk-acme", "Bearer sk-acme")],
                         ids=["two tenants", "same key twice"])
def test_two_authorization_headers_are_401(shared_rig: Rig, pair: tuple[str, str]) -> None:
    sent = [("authorization", pair[0]), ("authorization", pair[1])]
    r = shared_rig.client.get("/v1/memories?source_id=doc:1", headers=sent)
    assert assert_envelope(r, 401, "authorization")["code"] == "ambiguous_api_key"
    r = shared_rig.client.get("/v1/memories?source_id=doc:1", headers=[("api-key", "sk-acme"), ("api-key", "sk-globex")])
    assert assert_envelope(r, 401, "api-key")["code"] == "ambiguous_api_key"


@pytest.mark.parametrize("value", ["Bearer\tsk-a", "Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "sk-a"])
def test_an_authorization_header_of_another_form_is_named(shared_rig: Rig, value: str) -> None:
    r = shared_rig.client.post("/v1/memories/search", json={"query": "kettle"}, headers={"Authorization": value})
    error = assert_envelope(r, 401, "authorization")
    assert error["code"] == "invalid_authorization" and "Bearer <key>" in error["message"], error


CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"},
                        "messages": [{"role": "user", "content": "hi"}]}


def test_two_different_request_ids_are_400_naming_the_header(rig: Rig) -> None:
    raw = [("authorization", "Bearer sk-acme"), ("x-request-id", "first-1"), ("x-request-id", "second-2")]
    r = rig.client.post("/v1/chat/completions", json=CHAT, headers=raw)
    error = assert_envelope(r, 400, "x-request-id")
    assert "2 times" in error["message"], error
    assert rig.engine.calls == []
    same = [("authorization", "Bearer sk-acme"), ("x-request-id", "same-1"), ("x-request-id", "same-1")]
    assert rig.client.post("/v1/chat/completions", json=CHAT, headers=same).headers["x-request-id"] == "same-1"
