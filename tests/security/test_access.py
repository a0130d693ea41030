"""Every route asks for a key, and every bad query or path parameter is a 400 naming it.

The routes and their parameters come from the app's OpenAPI document, so a route added to the
ingress (the console's ``/v1/turns*`` and ``/v1/console/*`` included) is checked without an edit
here. A route that answers without a key must be in :data:`PUBLIC`; a parameter's bad values are
derived from its schema (type, bounds, length, pattern, choices), each in a request that is
otherwise the route's accepted one (the positive control: that request is not refused).

The console's static files (``/console``, not in the document) are public by design: they are the
same bytes for everybody (no tenant data; the page asks the API with the key the user types), and
no name from the URL reaches the file system.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

import pytest

from tests.security.conftest import TEST_ONLY, Rig, routes
from tests.security.test_inputs import VALID
from tests.unit.edge.conftest import assert_envelope, headers

#: Routes that answer without a key: liveness and the Prometheus scrape (operator counts, no tenant data).
PUBLIC = {("GET", "/healthz"), ("GET", "/metrics")}
#: An accepted value of each parameter (an id nobody holds where the route reads one: 404, not 400).
GOOD = {"memory_id": "0" * 32, "exp_id": "exp-1", "session_id": "s1", "turn_id": "0" * 32, "user": "u1",
        "source_id": "doc:1", "limit": "10", "before": "1700000000", "format": "view"}


def _parameters(rig: Rig) -> dict[tuple[str, str], list[dict[str, Any]]]:
    spec = rig.app.openapi()["paths"]
    return {(m.upper(), p): op.get("parameters", []) for p, ops in spec.items() for m, op in ops.items()}


def _request(route: tuple[str, str], params: list[dict[str, Any]], key: str | None = "sk-acme",
             **change: str | None) -> dict[str, Any]:
    """The route's accepted request (path, query, body) with ``key`` (None: no key) and ``change``
    applied (None drops a parameter)."""
    values = {p["name"]: GOOD[p["name"]] for p in params} | change
    path, query = route[1], {}
    for p in params:
        value = values.get(p["name"])
        if p["in"] == "path":
            path = path.replace(f"{{{p['name']}}}", quote(str(value), safe=""))
        elif value is not None:
            query[p["name"]] = value
    body = VALID.get(route)
    return {"method": route[0], "url": path, "params": query,
            "content": None if body is None else json.dumps(body),
            "headers": {"content-type": "application/json"} | ({"Authorization": f"Bearer {key}"} if key else {})}


def _schema(param: dict[str, Any]) -> dict[str, Any]:
    """The parameter's schema, the non-null member of an optional one."""
    schema = param["schema"]
    members = [s for s in schema.get("anyOf", [schema]) if s.get("type") != "null"]
    return members[0]


def _bad_values(param: dict[str, Any]) -> list[str]:
    """Values the parameter's schema refuses (as they travel in a URL)."""
    s, bad = _schema(param), []
    if "enum" in s:
        bad.append("not-a-choice")
    if s.get("type") == "integer":
        bad += ["abc", "1.5"]
    if s.get("type") == "number":
        bad += ["abc", "nan", "inf", "-inf"]
    if "minimum" in s:
        bad.append(str(s["minimum"] - 1))
    if "maximum" in s:
        bad.append(str(s["maximum"] * 10 if s["maximum"] > 0 else 1))
    if "maxLength" in s:
        bad.append("x" * (s["maxLength"] + 1))
    if s.get("minLength", 0) >= 1 and param["in"] == "query":
        bad.append("")  # NOTE: an empty path segment is another route (404), not a bad value
    if "pattern" in s:
        bad.append("bad id!")
    return bad


def _cases() -> list[Any]:
    """(route, parameter, bad value) of every parameter in the document of a fresh rig app."""
    from pathlib import Path
    from tempfile import TemporaryDirectory

    from tests.unit.edge.conftest import build_app

    with TemporaryDirectory() as tmp:
        app, memory = build_app(Path(tmp))
        try:
            spec = app.openapi()["paths"]
        finally:
            for shard_client in memory.coordinator.shards:
                shard_client.shard.close()
    out = []
    for path, ops in spec.items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                for value in _bad_values(p):
                    shown = value if len(value) < 20 else f"{len(value)} chars"
                    out.append(pytest.param((method.upper(), path), p["name"], value,
                                            id=f"{method.upper()} {path} {p['name']}={shown}"))
    return out


def test_every_route_but_the_public_ones_needs_a_valid_key(shared_rig: Rig) -> None:
    params = _parameters(shared_rig)
    checked = []
    for route in sorted(routes(shared_rig.app) - TEST_ONLY - PUBLIC):
        missing = shared_rig.client.request(**_request(route, params[route], key=None))
        assert assert_envelope(missing, 401)["code"] == "missing_api_key", (route, missing.text)
        wrong = shared_rig.client.request(**_request(route, params[route], key="sk-nobody"))
        assert assert_envelope(wrong, 401)["code"] == "invalid_api_key", (route, wrong.text)
        # NOTE: the positive control: the same request with acme's key gets past the key check.
        owner = shared_rig.client.request(**_request(route, params[route]))
        assert owner.status_code not in (400, 401), (route, owner.status_code, owner.text[:300])
        checked.append(route)
    assert ("GET", "/v1/turns/{turn_id}") in checked and ("GET", "/v1/console/health") in checked
    for route in PUBLIC:
        assert shared_rig.client.request(route[0], route[1]).status_code == 200, route


def test_every_parameter_has_bad_values_here(shared_rig: Rig) -> None:
    """Each query / path parameter of the document has a good value and at least one bad value."""
    for route, params in _parameters(shared_rig).items():
        for p in params:
            assert p["name"] in GOOD, f"{route}: parameter {p['name']!r} has no accepted value in GOOD"
            assert _bad_values(p), f"{route}: parameter {p['name']!r} has no constraint to check (unbounded?)"


@pytest.mark.parametrize(("route", "name", "value"), _cases())
def test_a_bad_parameter_is_400_naming_it(shared_rig: Rig, route: tuple[str, str], name: str, value: str) -> None:
    params = _parameters(shared_rig)[route]
    good = shared_rig.client.request(**_request(route, params))
    assert good.status_code != 400, (route, good.text[:300])
    r = shared_rig.client.request(**_request(route, params, **{name: value}))
    error = assert_envelope(r, 400, name)
    assert name in error["message"], error


@pytest.mark.parametrize("route", [("GET", "/v1/memories"), ("GET", "/v1/turns"), ("GET", "/v1/sessions/{session_id}")],
                         ids=" ".join)
def test_an_empty_or_dropped_query_is_400_or_the_default(shared_rig: Rig, route: tuple[str, str]) -> None:
    """A required query parameter left out is a 400 naming it; an optional one takes its default."""
    params = _parameters(shared_rig)[route]
    for p in (p for p in params if p["in"] == "query"):
        r = shared_rig.client.request(**_request(route, params, **{p["name"]: None}))
        if p.get("required"):
            assert_envelope(r, 400, p["name"])
        else:
            assert r.status_code in (200, 404), (route, p["name"], r.text[:300])


@pytest.mark.parametrize("name", ["", "/", "index.html", "console.js", "console.css"])
def test_console_files_are_the_same_bytes_for_everyone_with_a_strict_policy(shared_rig: Rig, name: str) -> None:
    url = "/console" + ("/" + name if name not in ("", "/") else name)
    anonymous = shared_rig.client.get(url)
    assert anonymous.status_code == 200, anonymous.text[:200]
    assert shared_rig.client.get(url, headers=headers("acme")).content == anonymous.content
    assert "script-src 'self'" in anonymous.headers["content-security-policy"]
    assert anonymous.headers["x-frame-options"] == "DENY"


@pytest.mark.parametrize("name", ["router.py", "__init__.py", "..%2Frouter.py", "%2e%2e%2f_health.py", ".%2Fstatic",
                                  "..%5Crouter.py", "%00", "..", "static%2Findex.html"])
def test_no_name_in_the_url_reaches_the_file_system(shared_rig: Rig, name: str) -> None:
    r = shared_rig.client.get(f"/console/{name}")
    assert r.status_code == 404, (name, r.status_code, r.text[:200])
    assert b"def " not in r.content and b"import" not in r.content
