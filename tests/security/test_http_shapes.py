"""Adversarial HTTP shapes the earlier passes left open, each a 4xx naming its field (or a
well-formed stream), never a 500, a cut stream, a silent coercion or a silently lost write.

* a stream whose turn fails with an unexpected exception after the 200 went out ended without an
  error event or ``[DONE]`` (only engine errors and timeouts were turned into an event);
* numbers and flags of an experience record and of a search's decay were coerced (``"1"`` -> 1,
  ``true`` -> 1.0, ``"true"`` -> True), and a v1.2 record's ``timestamp`` took epoch numbers;
* an experience expiring before its timestamp was stored and acknowledged while its segments'
  memories were refused by the memory tier (only a warning in the log);
* two memories with one source id in a batch: both ids acknowledged, the first already gone (404);
* a chat message of the wrong shape for its role (no content, an image in an assistant message,
  a tool answer without its call id, ...), an empty ``user`` or session id, and ids with control
  characters were answered as if well-formed;
* ``max_tokens`` and ``max_completion_tokens`` both sent and different: one silently won; a
  limit on ``max_completion_tokens`` named ``max_tokens``;
* ``response_format`` with a ``json_schema`` and ``type: text`` ignored the schema;
* ``Authorization`` and ``api-key`` with two different keys: the tenant was the first's;
* a body under a non-JSON (or no) content type read "body: Input should be a valid dictionary";
  one the JSON parser gave up on (not UTF-8, too deep, a 5000-digit number) a bare "There was an
  error parsing the body"; a query value with non-UTF-8 %-escapes was looked up as U+FFFD;
* a known ``/v1`` path asked with a method it does not take was a 404 (the catch-all);
* a metadata integer past 64 bits was stored (JavaScript, SQLite and numpy cannot hold it);
* an unknown experience id was a 404 with ``param: null``.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest
from starlette.routing import compile_path

from recallserve.serve.engine import EngineError
from tests.security.conftest import Rig, routes
from tests.security.test_inputs import VALID
from tests.unit.edge.conftest import assert_envelope, headers

_CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"},
                         "messages": [{"role": "user", "content": "hi"}]}
_IMAGE = {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}}
_CALL = {"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}
_EXP = VALID[("POST", "/v1/experiences")]
_V12: dict[str, Any] = {"version": "1.2", "metadata": {"source_model": "m", "timestamp": "2026-01-01T00:00:00Z"},
                        "segments": {"context": {"raw_text": "x"}, "outcome": {"answer": "1"}}}


def _events(text: str) -> list[str]:
    return [line.removeprefix("data: ") for line in text.split("\n\n") if line.startswith("data: ")]


@pytest.mark.parametrize("exc", [RuntimeError("bug"), ValueError("bug"), KeyError("bug"), EngineError("down")],
                         ids=lambda e: type(e).__name__)
# NOTE: the rig runs no agent loop, where ``agent: on`` is a 400 (it was the plain path in silence):
# the agent path's stream is test_chat_options.py's test_a_failure_mid_stream_on_the_agent_path_...
@pytest.mark.parametrize("agent", ["off", "auto"])
def test_a_failure_mid_stream_is_an_error_event_then_done(rig: Rig, exc: Exception, agent: str) -> None:
    def fail(*_: Any) -> str:
        raise exc

    rig.engine._next = fail  # type: ignore[method-assign]
    r = rig.client.post("/v1/chat/completions", headers=headers("acme"),
                        json=_CHAT | {"stream": True, "metadata": {"agent": agent}})
    assert r.status_code == 200, r.text
    events = _events(r.text)
    assert events[-1] == "[DONE]", r.text
    errors = [json.loads(e)["error"] for e in events[:-1] if "error" in json.loads(e)]
    assert len(errors) == 1 and set(errors[0]) == {"message", "type", "param", "code"}, r.text
    assert "bug" not in errors[0]["message"]  # NOTE: an internal error's text stays in the (masked) log


def _exp(**fields: Any) -> dict[str, Any]:
    """The valid record with ``a__b=v`` set at ``a.b`` (``reasoning__0__step_id``)."""
    record = copy.deepcopy(_EXP)
    for path, value in fields.items():
        *head, last = path.split("__")
        node: Any = record
        for key in head:
            node = node[int(key)] if isinstance(node, list) else node[key]
        node[int(last) if isinstance(node, list) else last] = value
    return record


COERCED = {
    "step_id as text": ("/v1/experiences", _exp(reasoning=[{"step_id": "1", "text": "x"}]), "reasoning.0.step_id"),
    "step_id as 1.0": ("/v1/experiences", _exp(reasoning=[{"step_id": 1.0, "text": "x"}]), "reasoning.0.step_id"),
    "step_id as true": ("/v1/experiences", _exp(reasoning=[{"step_id": True, "text": "x"}]), "reasoning.0.step_id"),
    "quantity as text": ("/v1/experiences", _exp(context={"raw_text": "x", "quantities": [{"name": "d", "value": "12"}]}),
                         "context.quantities.0.value"),
    "timestamp as text": ("/v1/experiences", _exp(metadata__timestamp="1700000000"), "metadata.timestamp"),
    "timestamp as true": ("/v1/experiences", _exp(metadata__timestamp=True), "metadata.timestamp"),
    "audit as 'true'": ("/v1/experiences", _exp(evaluation={"audit": "true"}), "evaluation.audit"),
    "audit as 1": ("/v1/experiences", _exp(evaluation={"audit": 1}), "evaluation.audit"),
    "retrieval_score as text": ("/v1/experiences", _exp(evaluation={"retrieval_score": "0.5"}),
                                "evaluation.retrieval_score"),
    "v1.2 timestamp as epoch": ("/v1/experiences", _V12 | {"metadata": {"source_model": "m", "timestamp": 1.7e9}},
                                "metadata.timestamp"),
    "decay_lambda as text": ("/v1/memories/search", {"query": "x", "decay": {"decay_lambda": "0.1"}}, "decay.decay_lambda"),
    "half_life_days as true": ("/v1/memories/search", {"query": "x", "decay": {"half_life_days": True}},
                               "decay.half_life_days"),
}


@pytest.mark.parametrize("case", COERCED)
def test_a_number_or_flag_of_the_wrong_type_is_400(shared_rig: Rig, case: str) -> None:
    path, body, field = COERCED[case]
    assert_envelope(shared_rig.client.post(path, json=body, headers=headers("acme")), 400, field)


@pytest.mark.parametrize("form", ["stored", "v1.2"])
def test_an_experience_expiring_before_its_timestamp_is_400_and_not_stored(shared_rig: Rig, form: str) -> None:
    exp_id = f"exp-expiry-{form}"
    if form == "stored":
        body = _exp(metadata__id=exp_id, metadata__timestamp=1.7e9, metadata__expires_at=1.6e9)
    else:
        body = _V12 | {"metadata": {"id": exp_id, "source_model": "m", "timestamp": "2026-01-01T00:00:00Z",
                                    "expires_at": "2020-01-01T00:00:00Z"}}
    c = shared_rig.client
    assert_envelope(c.post("/v1/experiences", json=body, headers=headers("acme")), 400, "metadata.expires_at")
    assert c.get(f"/v1/experiences/{exp_id}", headers=headers("acme")).status_code == 404


def test_a_batch_naming_one_source_id_twice_is_400_and_stores_nothing(shared_rig: Rig) -> None:
    c = shared_rig.client
    body = {"memories": [{"text": "one", "source_id": "twice"}, {"text": "x", "source_id": "other"},
                         {"text": "two", "source_id": "twice"}]}
    error = assert_envelope(c.post("/v1/memories", json=body, headers=headers("acme")), 400, "memories.2.source_id")
    assert "memories.0.source_id" in error["message"], error
    for source in ("twice", "other"):
        assert c.get("/v1/memories", params={"source_id": source}, headers=headers("acme")).json()["data"] == []


def _message(*messages: dict[str, Any]) -> dict[str, Any]:
    return _CHAT | {"messages": [{"role": "user", "content": "hi"}, *messages]}


CHAT_SHAPES = {
    "user content null": (_CHAT | {"messages": [{"role": "user", "content": None}]}, "messages.0.content"),
    "system content missing": (_message({"role": "system"}), "messages.1.content"),
    "content an empty list": (_CHAT | {"messages": [{"role": "user", "content": []}]}, "messages.0.content"),
    "image in an assistant message": (_message({"role": "assistant", "content": [_IMAGE]}), "messages.1.content"),
    "image in a system message": (_message({"role": "system", "content": [{"type": "text", "text": "x"}, _IMAGE]}),
                                  "messages.1.content"),
    "tool answer without its call id": (_message({"role": "tool", "content": "42"}), "messages.1.tool_call_id"),
    "call id on a user message": (_CHAT | {"messages": [{"role": "user", "content": "x", "tool_call_id": "c1"}]},
                                  "messages.0.tool_call_id"),
    "tool calls on a user message": (_CHAT | {"messages": [{"role": "user", "content": "x", "tool_calls": [_CALL]}]},
                                     "messages.0.tool_calls"),
    "empty name": (_CHAT | {"messages": [{"role": "user", "content": "x", "name": ""}]}, "messages.0.name"),
    "empty user": (_CHAT | {"user": ""}, "user"),
    "user with a newline": (_CHAT | {"user": "u1\nINFO forged log line"}, "user"),
    "empty session id": (_CHAT | {"metadata": {"agent": "off", "session_id": ""}}, "metadata.session_id"),
    "session id with a NUL": (_CHAT | {"metadata": {"agent": "off", "session_id": "s\x001"}}, "metadata.session_id"),
    "two different token budgets": (_CHAT | {"max_tokens": 5, "max_completion_tokens": 7}, "max_completion_tokens"),
    "max_completion_tokens over the limit": (_CHAT | {"max_completion_tokens": 10**9}, "max_completion_tokens"),
    "schema with type text": (_CHAT | {"response_format": {"type": "text", "json_schema": {"name": "x"}}},
                              "response_format.json_schema"),
    "unknown service tier": (_CHAT | {"service_tier": "ultra"}, "service_tier"),
}


@pytest.mark.parametrize("case", CHAT_SHAPES)
def test_a_chat_request_of_the_wrong_shape_is_400_naming_the_field(rig: Rig, case: str) -> None:
    body, field = CHAT_SHAPES[case]
    assert_envelope(rig.client.post("/v1/chat/completions", json=body, headers=headers("acme")), 400, field)
    assert rig.engine.calls == []


@pytest.mark.parametrize("body", [
    _CHAT | {"max_tokens": 8, "max_completion_tokens": 8},
    _message({"role": "assistant", "content": None, "tool_calls": [_CALL]},
             {"role": "tool", "content": "42", "tool_call_id": "c1"}),
    _CHAT | {"messages": [{"role": "user", "content": [{"type": "text", "text": "look"}, _IMAGE]}], "service_tier": "auto",
             "response_format": {"type": "text"}, "user": "u1", "metadata": {"agent": "off", "session_id": "s-1"}},
], ids=["same budget twice", "a tool exchange", "image in a user message"])
def test_the_well_formed_shapes_are_still_answered(shared_rig: Rig, body: dict[str, Any]) -> None:
    r = shared_rig.client.post("/v1/chat/completions", json=body, headers=headers("acme"))
    # NOTE: the 1x1 placeholder is no decodable image: a 400 about it (not about the shape) is fine.
    assert r.status_code == 200 or "image_url.url" in (r.json()["error"]["param"] or ""), r.text


def test_two_different_keys_in_two_headers_are_401(shared_rig: Rig) -> None:
    c = shared_rig.client
    r = c.get("/v1/models", headers={"Authorization": "Bearer sk-acme", "api-key": "sk-globex"})
    assert assert_envelope(r, 401)["code"] == "ambiguous_api_key"
    assert c.get("/v1/models", headers={"Authorization": "Bearer sk-acme", "api-key": "sk-acme"}).status_code == 200
    assert c.get("/v1/models", headers={"api-key": "sk-acme"}).status_code == 200


@pytest.mark.parametrize("content_type", ["text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x",
                                          None])
def test_a_json_body_under_another_content_type_is_415(shared_rig: Rig, content_type: str | None) -> None:
    extra = {} if content_type is None else {"content-type": content_type}
    r = shared_rig.client.post("/v1/chat/completions", content=json.dumps(_CHAT).encode(),
                               headers={**headers("acme"), **extra})
    assert assert_envelope(r, 415, "content-type")["message"].startswith("content-type: ")


def test_json_content_types_are_read(shared_rig: Rig) -> None:
    for content_type in ("application/json; charset=utf-8", "application/merge-patch+json"):
        r = shared_rig.client.post("/v1/chat/completions", content=json.dumps(_CHAT).encode(),
                                   headers={**headers("acme"), "content-type": content_type})
        assert r.status_code == 200, r.text


@pytest.mark.parametrize("raw", [
    b'{"model": "recallserve", "messages": [{"role": "user", "content": "caf\xe9"}]}',
    b'{"model": "recallserve", "messages": ' + b"[" * 100_000 + b"]" * 100_000 + b"}",
    b'{"model": "recallserve", "max_tokens": ' + b"9" * 5000 + b', "messages": []}',
], ids=["latin-1 bytes", "100k levels deep", "a 5000-digit number"])
def test_a_body_the_parser_gives_up_on_is_400_about_the_body(shared_rig: Rig, raw: bytes) -> None:
    r = shared_rig.client.post("/v1/chat/completions", content=raw,
                               headers={**headers("acme"), "content-type": "application/json"})
    assert assert_envelope(r, 400)["message"].startswith("body: could not be parsed as JSON"), r.text


@pytest.mark.parametrize("url, param", [("/v1/memories?source_id=%FF", "source_id"),
                                        ("/v1/turns?limit=5&session_id=s%C3%28", "session_id")])
def test_a_query_value_that_is_not_utf8_is_400(shared_rig: Rig, url: str, param: str) -> None:
    assert_envelope(shared_rig.client.get(url, headers=headers("acme")), 400, param)


def test_a_known_path_with_a_method_it_does_not_take_is_405(shared_rig: Rig) -> None:
    c = shared_rig.client
    by_path: dict[str, set[str]] = {}
    for method, path in routes(shared_rig.app):
        by_path.setdefault(path, set()).add(method)
    checked = 0
    for path, methods in by_path.items():
        url = path.replace("{memory_id}", "m1").replace("{exp_id}", "exp-1").replace("{session_id}", "s1") \
            .replace("{turn_id}", "t1")
        if not url.startswith("/v1/") or "{" in url:
            continue
        # NOTE: /v1/experiences/search is also /v1/experiences/{exp_id}: GET on it is a real route.
        taken = {m for other, ms in by_path.items() if compile_path(other)[0].match(url) for m in ms}
        for method in sorted({"GET", "POST", "PUT", "PATCH", "DELETE"} - taken):
            r = c.request(method, url, headers=headers("acme"))
            error = assert_envelope(r, 405, "method")
            assert error["code"] == "method_not_allowed", (method, url, error)
            assert set(r.headers["allow"].split(", ")) >= methods, (method, url, r.headers)
            checked += 1
    assert checked > 20
    assert_envelope(c.get("/v1/no/such/route", headers=headers("acme")), 404)


@pytest.mark.parametrize("value", [2**63, -(2**63) - 1, 10**30])
def test_a_metadata_integer_past_64_bits_is_400(shared_rig: Rig, value: int) -> None:
    c = shared_rig.client
    body = {"memories": [{"text": "big number", "source_id": "big-int", "metadata": {"n": value}}]}
    assert_envelope(c.post("/v1/memories", json=body, headers=headers("acme")), 400, "memories.0.metadata")
    assert c.get("/v1/memories", params={"source_id": "big-int"}, headers=headers("acme")).json()["data"] == []
    ok = {"memories": [{"text": "edge number", "metadata": {"lo": -(2**63), "hi": 2**63 - 1}}]}
    assert c.post("/v1/memories", json=ok, headers=headers("acme")).status_code == 200


@pytest.mark.parametrize("path, body, field", [
    ("/v1/memories", {"memories": [{"text": "x", "image_hash": ""}]}, "memories.0.image_hash"),
    ("/v1/experiences/search", {"query": "x", "source_model": "m", "domain": ""}, "domain"),
], ids=["empty image hash", "empty experience domain"])
def test_an_empty_id_is_400(shared_rig: Rig, path: str, body: dict[str, Any], field: str) -> None:
    assert_envelope(shared_rig.client.post(path, json=body, headers=headers("acme")), 400, field)


def test_an_unknown_experience_names_its_id(shared_rig: Rig) -> None:
    c = shared_rig.client
    assert_envelope(c.get("/v1/experiences/exp-nobody", headers=headers("acme")), 404, "exp_id")
    r = c.post("/v1/experiences/exp-nobody/label", json={"label": "wrong"}, headers=headers("acme"))
    assert_envelope(r, 404, "exp_id")
