"""Finite and bounded input on every route with a body: each number of a valid body replaced by
NaN / +-Infinity, each string by 2 MiB, each list by 10,000 items and each map by 10,000 keys is
a 4xx in the JSON error envelope (never a 5xx, never stored); a body over the cap is a 413.

The valid bodies are one per route in :data:`VALID`; a route of the OpenAPI document with a
request body and no entry fails :func:`test_every_body_route_has_a_valid_body` by name.
"""

from __future__ import annotations

import copy
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from tests.security.conftest import TEST_ONLY, A, Rig
from tests.unit.edge.conftest import assert_envelope, build_app, headers
from tests.unit.experience._records import speed_record

_EXP = speed_record(timestamp=1.7e9) | {"evaluation": {"error_tags": ["units"]}}
_EXP["context"]["constraints"] = ["answer in km/h"]
_EXP["verification"].append({"type": "boundary_test", "target": "80", "input": {"lo": 0, "hi": 200}})
# One valid body per (method, path): every kind of field the route takes (numbers, strings, lists, maps).
VALID: dict[tuple[str, str], dict[str, Any]] = {
    ("POST", "/v1/memories"): {"memories": [{
        "text": "ticket T-88: grinder jammed", "source_id": "t:88", "metadata": {"order": "104208", "n": 3},
        "topic": "support/grinder", "parts": [{"name": "photo", "text": "burrs"}], "created_at": 1.7e9,
        "retention_weight": 2.0, "error_tags": ["jam"]}]},
    ("POST", "/v1/memories/search"): {
        "query": "grinder", "k": 4, "threshold": 0.1, "filters": {"kinds": ["text"], "metadata": {"n": 3},
                                                                  "created_after": 1.0},
        "decay": {"decay": "exponential", "half_life_days": 30.0, "similarity_weight": 0.5}},
    ("POST", "/v1/experiences"): _EXP,
    ("POST", "/v1/experiences/search"): {"query": "speed", "source_model": "m", "k": 2, "error_tags": ["units"],
                                          "archival_k": 1},
    ("POST", "/v1/experiences/{exp_id}/label"): {"label": "wrong", "error_tags": ["units"], "note": "off by 15"},
    ("POST", "/v1/chat/completions"): {
        "model": "recallserve", "user": "u1", "temperature": 0.5, "max_tokens": 16, "stop": ["\n\n"],
        "metadata": {"session_id": "s1", "agent": "off"},
        "messages": [{"role": "system", "content": "be brief"},
                     {"role": "user", "content": [{"type": "text", "text": "hello"}]}]},
}
BIG_STRING = "x" * 2 * 2**20
MANY = 10_000


def _url(path: str) -> str:
    return path.replace("{exp_id}", "exp-1").replace("{memory_id}", "0" * 32).replace("{session_id}", "s1")


def _nodes(value: Any, where: tuple = ()) -> Iterator[tuple[tuple, Any]]:
    yield where, value
    if isinstance(value, dict):
        for k, v in value.items():
            yield from _nodes(v, (*where, k))
    elif isinstance(value, list):
        for i, v in enumerate(value):
            yield from _nodes(v, (*where, i))


def _replaced(body: dict, where: tuple, new: Any) -> dict:
    out = copy.deepcopy(body)
    node = out
    for key in where[:-1]:
        node = node[key]
    node[where[-1]] = new
    return out


def _mutations(body: dict) -> Iterator[tuple[str, dict]]:
    for where, value in _nodes(body):
        name = ".".join(map(str, where))
        if not where:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool):
            for bad in (float("nan"), float("inf"), float("-inf")):
                yield f"{name}={bad}", _replaced(body, where, bad)
        elif isinstance(value, str):
            yield f"{name}=2MiB", _replaced(body, where, BIG_STRING)
        elif isinstance(value, list) and value:
            yield f"{name}=[{MANY}]", _replaced(body, where, [copy.deepcopy(value[0]) for _ in range(MANY)])
        elif isinstance(value, dict) and value:
            yield f"{name}={{{MANY}}}", _replaced(body, where, value | {f"k{i}": 1 for i in range(MANY)})


CASES = [pytest.param(route, body, id=f"{route[1]} {name}")
         for route, valid in VALID.items() for name, body in _mutations(valid)]


def _send(c: TestClient, route: tuple[str, str], body: Any):  # type: ignore[no-untyped-def]
    # NOTE: allow_nan: Python's JSON writes NaN / Infinity literals, which the server's parser reads.
    return c.request(route[0], _url(route[1]), content=json.dumps(body, allow_nan=True),
                     headers={**headers("acme"), "content-type": "application/json"})


def test_every_body_route_has_a_valid_body(shared_rig: Rig) -> None:
    spec = shared_rig.app.openapi()["paths"]
    with_body = {(m.upper(), p) for p, ops in spec.items() for m, op in ops.items() if "requestBody" in op}
    assert with_body - TEST_ONLY == VALID.keys(), f"routes with a body and no valid body here: {with_body ^ VALID.keys()}"


@pytest.mark.parametrize("route", sorted(VALID), ids=" ".join)
def test_the_valid_bodies_are_valid(rig: Rig, route: tuple[str, str]) -> None:
    """The positive control: each mutation below changes exactly one thing of an accepted body."""
    if route[1].endswith("/label"):
        exp_id = rig.client.post("/v1/experiences", json=speed_record(exp_id="exp-1"), headers=headers("acme"))
        assert exp_id.status_code == 201, exp_id.text
    r = _send(rig.client, route, VALID[route])
    assert r.status_code < 300, r.text


@pytest.mark.parametrize(("route", "body"), CASES)
def test_non_finite_and_oversized_values_are_4xx(shared_rig: Rig, route: tuple[str, str], body: dict) -> None:
    # NOTE: one rig for every case (as one server answers them all): a refused request changes nothing.
    r = _send(shared_rig.client, route, body)
    assert 400 <= r.status_code < 500, (r.status_code, r.text[:300])
    assert_envelope(r, r.status_code)


@pytest.mark.parametrize("raw", ["NaN", "Infinity", "[]", "null", '"x"', "1e999", "{", "[" * 10_000, '{"a":' * 10_000])
def test_malformed_bodies_are_4xx(shared_rig: Rig, raw: str) -> None:
    for route in VALID:
        r = shared_rig.client.request(route[0], _url(route[1]), content=raw,
                               headers={**headers("acme"), "content-type": "application/json"})
        assert 400 <= r.status_code < 500, (route, r.status_code, r.text[:300])
        assert_envelope(r, r.status_code)


def test_body_over_the_cap_is_413_on_every_route(tmp_path: Path) -> None:
    app, memory = build_app(tmp_path, max_body_bytes=4096)
    spec = app.openapi()["paths"]
    try:
        with TestClient(app, raise_server_exceptions=False) as c:
            for path, ops in spec.items():
                for method in ops:
                    r = c.request(method.upper(), _url(path), content=b"x" * 5000, headers=headers("acme"))
                    assert_envelope(r, 413)
    finally:
        for shard_client in memory.coordinator.shards:
            shard_client.shard.close()


CHAT = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": [{"role": "user", "content": "hi"}]}


def test_a_memory_batch_over_the_total_text_bound_is_400_and_stores_nothing(rig: Rig) -> None:
    # NOTE: every field is within its own bound (32,000 characters); the batch is not (40 x 30,000).
    memories = [{"text": f"note {i} " + "word " * 6_000, "source_id": f"big:{i}"} for i in range(40)]
    r = rig.client.post("/v1/memories", json={"memories": memories}, headers=headers(A))
    err = assert_envelope(r, 400, "memories")
    assert "in all" in err["message"], err
    listed = rig.client.get("/v1/memories", params={"source_id": "big:0"}, headers=headers(A))
    assert listed.status_code == 200 and listed.json()["data"] == [], listed.text


def test_a_memory_batch_within_the_bound_is_stored(rig: Rig) -> None:
    memories = [{"text": f"note {i} " + "word " * 6_000, "source_id": f"big:{i}"} for i in range(6)]
    r = rig.client.post("/v1/memories", json={"memories": memories}, headers=headers(A))
    assert r.status_code == 200 and len(r.json()["ids"]) == 6, r.text


def test_too_many_content_parts_in_all_is_400_before_they_are_validated(shared_rig: Rig) -> None:
    from recallserve.serve.api.chat_protocol import MAX_TOTAL_PARTS

    part = {"type": "text", "text": "a"}
    msgs = [{"role": "user", "content": [part] * 256}] * (MAX_TOTAL_PARTS // 256 + 1)
    r = shared_rig.client.post("/v1/chat/completions", json={**CHAT, "messages": msgs}, headers=headers(A))
    error = assert_envelope(r, 400, "messages")
    assert f"at most {MAX_TOTAL_PARTS}" in error["message"], error
    ok = [{"role": "user", "content": [part] * 256}] * (MAX_TOTAL_PARTS // 256)
    r = shared_rig.client.post("/v1/chat/completions", json={**CHAT, "messages": ok}, headers=headers(A))
    assert r.status_code == 200, r.text
