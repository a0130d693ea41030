"""A fuzz pass over the OpenAPI document: every operation, bodies drawn from its request schema
(hypothesis-jsonschema) and from arbitrary JSON, path and query parameters from theirs; no
answer is a 5xx and every error is the JSON envelope.

Seeded (``derandomize``: the same examples every run) and bounded: :data:`EXAMPLES` per operation,
no hypothesis database, so a CI failure reproduces locally with the same command.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis_jsonschema import from_schema

from tests.security.conftest import TEST_ONLY, Rig, routes
from tests.security.test_inputs import VALID
from tests.unit.experience._records import speed_record
from tests.unit.edge.conftest import assert_envelope, headers

# NOTE: slow: past the marker's ~30 s (see EXAMPLES).
pytestmark = pytest.mark.slow

# NOTE: 40 examples x 16 operations: about a minute on the 2-core CI machine.
EXAMPLES = 40
_JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=20),
                     lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
                     max_leaves=12)


def _schema(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` with the document's components beside it, so its ``#/components/...`` refs resolve."""
    return {**schema, "components": spec["components"]}


def _request(spec: dict[str, Any], method: str, path: str, known: list[str]) -> st.SearchStrategy[dict[str, Any]]:
    """Parameters and body of one request; ``known`` are ids that exist, so id routes get past 404."""
    op = spec["paths"][path][method.lower()]
    params: dict[str, st.SearchStrategy[Any]] = {}
    optional: dict[str, st.SearchStrategy[Any]] = {}
    for p in op.get("parameters", []):
        s = from_schema(_schema(spec, p["schema"])) | st.text(max_size=40)
        if p["in"] in ("path", "query"):
            s = st.sampled_from(known) | s
        (params if p.get("required") else optional)[f"{p['in']}:{p['name']}"] = s
    body: st.SearchStrategy[Any] = st.just(None)
    if "requestBody" in op:
        schema = op["requestBody"]["content"]["application/json"]["schema"]
        # NOTE: the route's valid body too (tests/security/test_inputs.py), so the handler is reached.
        body = st.just(VALID[(method, path)]) | from_schema(_schema(spec, schema)) | _JSON
    return st.fixed_dictionaries({"params": st.fixed_dictionaries(params, optional=optional), "body": body})


def _url(path: str, params: dict[str, Any]) -> tuple[str, dict[str, Any]]:
    query = {}
    for key, value in params.items():
        where, name = key.split(":", 1)
        if where == "path":
            path = path.replace(f"{{{name}}}", quote(str(value), safe="") or "x")
        elif where == "query":
            query[name] = value if isinstance(value, str) else json.dumps(value)
    return path, query


def test_no_operation_answers_5xx(rig: Rig) -> None:
    spec = rig.app.openapi()
    memory = rig.client.post("/v1/memories", json=VALID[("POST", "/v1/memories")], headers=headers("acme"))
    assert rig.client.post("/v1/experiences", json=speed_record(exp_id="exp-1"), headers=headers("acme")).is_success
    assert rig.client.post("/v1/chat/completions", json=VALID[("POST", "/v1/chat/completions")],
                           headers=headers("acme")).is_success  # session s1 of user u1
    known = [memory.json()["ids"][0], "exp-1", "s1", "u1"]
    seen: dict[str, set[int]] = {}
    # NOTE: DELETE last, so the other id routes still find the known memory.
    for method, path in sorted(routes(rig.app) - TEST_ONLY, key=lambda r: (r[0] == "DELETE", r)):

        # NOTE: the rig is shared by the examples on purpose (state builds up, as on a server).
        @settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True,
                  suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                                         HealthCheck.filter_too_much, HealthCheck.function_scoped_fixture])
        @given(req=_request(spec, method, path, known))
        def one(req: dict[str, Any]) -> None:
            url, query = _url(path, req["params"])
            content = None if req["body"] is None else json.dumps(req["body"], allow_nan=True)
            r = rig.client.request(method, url, params=query, content=content,
                                   headers={**headers("acme"), "content-type": "application/json"})
            assert r.status_code < 500, f"{method} {url} {query} {content and content[:300]} -> {r.status_code} {r.text[:300]}"
            if r.status_code >= 400:
                assert_envelope(r, r.status_code)
            seen.setdefault(f"{method} {path}", set()).add(r.status_code // 100)

        one()
    # The pass reached the handlers, not only validation: every operation without an id in its
    # path answered some 2xx (one with an id may draw none of the known ids in its examples).
    assert [op for op, classes in seen.items() if 2 not in classes and "{" not in op] == [], seen
