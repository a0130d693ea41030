"""A fifth adversarial pass over the HTTP API: what the other files of tests/security left open.

* a memory time sent as a number above 2e10 (``created_at: 1e11``, year 5138 in the epoch seconds
  the API documents) was read by pydantic as epoch *milliseconds*: stored as 1973-03-03, and a
  search filter ``created_after: 1e11`` matched every memory; an epoch in milliseconds was taken
  silently rather than named;
* ids a client chooses and then reads back as a URL's ``{id}``: a chat's ``metadata.session_id``
  holding ``/`` (or being ``.`` / ``..``), an experience id ``.`` / ``..`` and an ``x-request-id``
  ``.`` / ``..`` were acknowledged and stored, and their session, record or turn could never be
  read (HTTP clients drop dot segments; ``/`` and ``%2F`` split the path);
* two metadata keys holding personal data were masked to one key (``{"a@x.io": 1, "b@y.io": 2}``
  became ``{"[EMAIL]": 2}``): acknowledged with a value silently dropped; and a search filter
  naming a stored metadata value or topic as the client sent it matched nothing (the stored one
  is masked, the filter was not), nor did an experience search's ``domain``;
* a client that closed a stream mid-answer lost the turn: the server abandoned the stream's
  generator at the next chunk, before the session append, the trace and the write-back (a plain
  request whose client left was stored in full); under ASGI spec 2.4 the disconnect was also
  logged as an unhandled server error with its traceback;
* an error quoted the client's names in full: an unknown or repeated 1-MB key (body or query) was
  echoed in the message and the param (2 MB answered and logged for a 1-MB body), as was a long
  unknown path;
* ``OPTIONS`` and ``TRACE`` of a known path were Starlette's bare "Method Not Allowed" (no
  ``param``, an ``Allow`` of one route's methods), unlike ``PUT`` and ``PATCH``;
* two ``x-request-id`` headers with different values: the first was taken silently (the trace kept
  one id, a proxy's log may show the other), where two API keys are refused.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from typing import Any
from urllib.parse import quote

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import ANSWER, assert_envelope, headers
from tests.unit.experience._records import speed_record

CHAT: dict[str, Any] = {"model": "recallserve", "metadata": {"agent": "off"},
                        "messages": [{"role": "user", "content": "hi"}]}
YEAR_5138 = 1e11
"""Epoch seconds past 2e10, where pydantic switches to reading milliseconds."""


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


def _until(check: Any, timeout_s: float = 10.0) -> Any:
    """``check()`` once truthy (polled), else its last value."""
    deadline = time.monotonic() + timeout_s
    while not (got := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


# ---- a number in a time field is epoch seconds ---------------------------------------------------

@pytest.mark.parametrize("value", [YEAR_5138, int(YEAR_5138), "100000000000"], ids=["float", "int", "string"])
@pytest.mark.parametrize("field", ["created_at", "expires_at"])
def test_a_memory_time_past_2e10_is_kept_as_seconds(rig: Rig, field: str, value: Any) -> None:
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "far future note", field: value}]})
    assert r.status_code == 200, r.text
    got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()
    assert got[field] == YEAR_5138, got


@pytest.mark.parametrize(("field", "keeps"), [("created_after", False), ("created_before", True)])
def test_a_filter_time_past_2e10_is_seconds(rig: Rig, field: str, keeps: bool) -> None:
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "the cat sat on the mat"}]}).status_code == 200
    r = _json(rig, "POST", "/v1/memories/search", {"query": "cat", "filters": {field: YEAR_5138}})
    assert r.status_code == 200, r.text
    assert bool(r.json()["data"]) is keeps, r.text


@pytest.mark.parametrize(("path", "body", "param"), [
    ("/v1/memories", {"memories": [{"text": "x", "created_at": 1.7e12}]}, "memories.0.created_at"),
    ("/v1/memories", {"memories": [{"text": "x", "expires_at": 1_900_000_000_000}]}, "memories.0.expires_at"),
    ("/v1/memories/search", {"query": "x", "filters": {"created_after": 1.7e12}}, "filters.created_after"),
    ("/v1/memories/search", {"query": "x", "filters": {"created_before": "1700000000000"}}, "filters.created_before"),
], ids=["created_at", "expires_at", "created_after", "created_before"])
def test_an_epoch_in_milliseconds_is_400_naming_the_field(rig: Rig, path: str, body: dict[str, Any], param: str) -> None:
    error = assert_envelope(_json(rig, "POST", path, body), 400, param)
    assert "milliseconds" in error["message"], error


def test_iso_times_and_seconds_still_work(rig: Rig) -> None:
    r = _json(rig, "POST", "/v1/memories", {"memories": [
        {"text": "a", "created_at": "2026-01-01T00:00:00Z"}, {"text": "b", "created_at": 1_767_225_600}]})
    assert r.status_code == 200, r.text
    times = [_json(rig, "GET", f"/v1/memories/{i}").json()["created_at"] for i in r.json()["ids"]]
    assert times == [1_767_225_600.0, 1_767_225_600.0]


# ---- ids that a URL cannot carry back ----------------------------------------------------------------

@pytest.mark.parametrize("sid", ["a/b", "..", ".", "x/summary"])
def test_a_session_id_a_url_cannot_carry_is_400(rig: Rig, sid: str) -> None:
    body = CHAT | {"metadata": {"agent": "off", "session_id": sid}}
    error = assert_envelope(_json(rig, "POST", "/v1/chat/completions", body), 400, "metadata.session_id")
    assert error["message"].startswith("metadata.session_id: "), error
    assert rig.engine.calls == []


def test_a_session_id_with_dots_or_url_characters_is_still_read_back(rig: Rig) -> None:
    # NOTE: no "%" in these: the TestClient decodes a path twice (httpx, then unquote), a real server once.
    for sid in ("a.b", "...", "a?b#c"):
        r = _json(rig, "POST", "/v1/chat/completions", CHAT | {"metadata": {"agent": "off", "session_id": sid}})
        assert r.status_code == 200, r.text
        got = _json(rig, "GET", f"/v1/sessions/{quote(sid, safe='')}")
        assert got.status_code == 200 and got.json()["id"] == sid, (sid, got.text)


@pytest.mark.parametrize("exp_id", ["..", "."])
@pytest.mark.parametrize("form", ["stored", "v1.2"])
def test_an_experience_id_that_is_a_dot_segment_is_400(rig: Rig, form: str, exp_id: str) -> None:
    if form == "stored":
        body = speed_record(exp_id=exp_id)
    else:
        body = {"version": "1.2", "metadata": {"id": exp_id, "source_model": "m", "timestamp": "2026-01-01T00:00:00Z"},
                "segments": {"context": {"raw_text": "x"}, "outcome": {"answer": "1"}}}
    error = assert_envelope(_json(rig, "POST", "/v1/experiences", body), 400, "metadata.id")
    assert "dot segment" in error["message"], error
    assert _json(rig, "GET", "/v1/experiences/review").json() == []


@pytest.mark.parametrize("request_id", ["..", "."])
def test_a_request_id_that_is_a_dot_segment_is_400(rig: Rig, request_id: str) -> None:
    r = rig.client.post("/v1/chat/completions", json=CHAT, headers=headers(A, **{"x-request-id": request_id}))
    error = assert_envelope(r, 400, "x-request-id")
    assert "dot segment" in error["message"], error
    assert rig.engine.calls == []


def test_a_request_id_with_dots_is_still_a_readable_turn(rig: Rig) -> None:
    r = rig.client.post("/v1/chat/completions", json=CHAT, headers=headers(A, **{"x-request-id": "a..b"}))
    assert r.status_code == 200 and r.headers["x-request-id"] == "a..b", r.text
    assert _until(lambda: _json(rig, "GET", "/v1/turns/a..b").status_code == 200)


# ---- masking keeps what was acknowledged, and finds it as it was sent ---------------------------

def test_two_metadata_keys_with_personal_data_stay_two_keys(rig: Rig) -> None:
    sent = {"jane.doe@example.com": "first", "john.roe@example.org": "second", "plain": "third"}
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "contacts", "metadata": sent}]})
    assert r.status_code == 200, r.text
    got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()["metadata"]
    assert sorted(got.values()) == ["first", "second", "third"], got
    assert "example" not in json.dumps(got), got


@pytest.mark.parametrize("filters", [{"metadata": {"owner": "jane.doe@example.com"}},
                                     {"metadata": {"jane.doe@example.com": "yes"}},
                                     {"topic_prefix": "crm/jane.doe@example.com"}], ids=["value", "key", "topic"])
def test_a_filter_finds_a_memory_by_the_personal_data_it_was_sent_with(rig: Rig, filters: dict[str, Any]) -> None:
    memory = {"text": "the renewal call went well", "topic": "crm/jane.doe@example.com/calls",
              "metadata": {"owner": "jane.doe@example.com", "jane.doe@example.com": "yes"}}
    assert _json(rig, "POST", "/v1/memories", {"memories": [memory]}).status_code == 200
    r = _json(rig, "POST", "/v1/memories/search", {"query": "renewal call", "filters": filters})
    assert r.status_code == 200, r.text
    assert [h["text"] for h in r.json()["data"]] == [memory["text"]], r.text


def test_an_experience_search_finds_a_domain_by_the_personal_data_it_was_sent_with(rig: Rig) -> None:
    domain = "units-jane.doe@example.com"
    created = _json(rig, "POST", "/v1/experiences", speed_record(domain=domain))
    assert created.status_code == 201, created.text
    assert "example.com" not in created.text
    body = {"query": "car speed", "source_model": "Qwen2.5-Coder-1.5B-Instruct", "domain": domain}
    r = _json(rig, "POST", "/v1/experiences/search", body)
    assert r.status_code == 200, r.text
    assert [h["experience"]["record"]["metadata"]["id"] for h in r.json()["hits"]] == \
        [created.json()["record"]["metadata"]["id"]], r.text


# ---- a client that leaves mid-stream -------------------------------------------------------------

async def _leave_after_first_chunk(rig: Rig, session_id: str, spec_version: str) -> list[dict[str, Any]]:
    """POST a streamed chat turn straight to the ASGI app, and close the connection once the first
    chunk arrived: ASGI 2.0-2.3 servers say so with ``http.disconnect`` (uvicorn), 2.4 ones make the
    next send fail with ``OSError``."""
    body = json.dumps(CHAT | {"stream": True, "metadata": {"agent": "off", "session_id": session_id}}).encode()
    scope = {"type": "http", "asgi": {"version": "3.0", "spec_version": spec_version}, "http_version": "1.1",
             "method": "POST", "scheme": "http", "path": "/v1/chat/completions", "raw_path": b"/v1/chat/completions",
             "query_string": b"", "root_path": "", "client": ("127.0.0.1", 50000), "server": ("testserver", 80),
             "headers": [(b"authorization", b"Bearer sk-acme"), (b"content-type", b"application/json"),
                         (b"content-length", str(len(body)).encode()), (b"host", b"testserver")]}
    sent: list[dict[str, Any]] = []
    gone = asyncio.Event()
    request = [{"type": "http.request", "body": body, "more_body": False}]

    async def receive() -> dict[str, Any]:
        if request:
            return request.pop()
        await gone.wait()
        return {"type": "http.disconnect"}

    async def send(message: dict[str, Any]) -> None:
        if gone.is_set() and spec_version >= "2.4":
            raise OSError("connection closed by the client")
        sent.append(message)
        if message["type"] == "http.response.body" and message.get("body"):
            gone.set()
            await asyncio.sleep(0.05)  # NOTE: the server notices the disconnect before the next chunk

    await rig.app(scope, receive, send)
    return sent


@pytest.mark.parametrize("spec_version", ["2.3", "2.4"])
def test_a_client_leaving_mid_stream_keeps_its_turn(rig: Rig, spec_version: str,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    sid = f"left-{spec_version}"
    with caplog.at_level(logging.INFO, logger="recallserve.api"):
        sent = rig.client.portal.call(_leave_after_first_chunk, rig, sid, spec_version)
    assert sent[0]["status"] == 200
    chunks = [m for m in sent if m["type"] == "http.response.body" and m.get("body")]
    assert len(chunks) == 1 and b"[DONE]" not in chunks[0]["body"], chunks

    def stored() -> bool:
        r = _json(rig, "GET", f"/v1/sessions/{sid}")
        return r.status_code == 200 and r.json()["message_count"] == 2

    assert _until(stored), _json(rig, "GET", f"/v1/sessions/{sid}").text
    turns = _until(lambda: _json(rig, "GET", "/v1/turns", params={"session_id": sid}).json()["data"])
    assert [t["session_id"] for t in turns] == [sid], turns
    assert not [r for r in caplog.records if "unhandled error" in r.getMessage()], caplog.text


def test_a_stream_read_to_the_end_is_unchanged(rig: Rig) -> None:
    body = CHAT | {"stream": True, "stream_options": {"include_usage": True},
                   "metadata": {"agent": "off", "session_id": "whole"}}
    r = _json(rig, "POST", "/v1/chat/completions", body)
    assert r.status_code == 200, r.text
    events = [line[len("data: "):] for line in r.text.splitlines() if line.startswith("data: ")]
    assert events[-1] == "[DONE]"
    chunks = [json.loads(e) for e in events[:-1]]
    assert "".join(c["choices"][0]["delta"].get("content", "") for c in chunks if c["choices"]) == ANSWER
    assert chunks[-1]["usage"]["total_tokens"] > 0, chunks[-1]
    assert _json(rig, "GET", "/v1/sessions/whole").json()["message_count"] == 2


# ---- an error quotes the client's names clipped -----------------------------------------------------

LONG = "k" * 200_000
ECHOES = {
    "unknown body key": ("POST", "/v1/chat/completions", json.dumps({**CHAT, LONG: 1})),
    "unknown nested key": ("POST", "/v1/memories", json.dumps({"memories": [{"text": "x", LONG: 1}]})),
    "duplicate key": ("POST", "/v1/memories/search", '{"query": "x", "%s": 1, "%s": 2}' % (LONG, LONG)),
    "unknown query parameter": ("GET", f"/v1/turns?{'q' * 20_000}=1", None),
    "repeated query parameter": ("GET", f"/v1/turns?{'q' * 20_000}=1&{'q' * 20_000}=2", None),
    "unknown route": ("GET", f"/v1/{'r' * 20_000}", None),
    "method not allowed": ("PUT", f"/v1/memories/{'m' * 20_000}", None),
}


@pytest.mark.parametrize("case", ECHOES)
def test_an_error_quotes_a_long_client_name_clipped(rig: Rig, case: str) -> None:
    method, url, body = ECHOES[case]
    r = rig.client.request(method, url, content=body, headers=headers(A, **{"content-type": "application/json"}))
    assert 400 <= r.status_code < 500, r.text[:300]
    error = r.json()["error"]
    assert len(r.content) < 2_000 and len(error["param"] or "") <= 400, (len(r.content), error["message"][:300])
    assert "more characters)" in error["message"], error["message"][:300]


# ---- every method of a known path is answered as PUT and PATCH are -----------------------------------

@pytest.mark.parametrize("method", ["OPTIONS", "TRACE"])
@pytest.mark.parametrize(("url", "allowed"), [("/v1/models", "GET"), ("/v1/memories/m1", "DELETE, GET"),
                                              ("/v1/chat/completions", "POST")])
def test_another_method_of_a_known_path_is_405_naming_it(rig: Rig, method: str, url: str, allowed: str) -> None:
    r = rig.client.request(method, url, headers=headers(A))
    assert r.status_code == 405 and r.headers.get("allow") == allowed, (r.status_code, r.headers)
    error = assert_envelope(r, 405, "method")
    assert error["message"].startswith(f"method: {method} is not allowed"), error


def test_two_different_request_ids_are_400_naming_the_header(rig: Rig) -> None:
    raw = [("authorization", "Bearer sk-acme"), ("x-request-id", "first-1"), ("x-request-id", "second-2")]
    r = rig.client.post("/v1/chat/completions", json=CHAT, headers=raw)
    error = assert_envelope(r, 400, "x-request-id")
    assert "2 times" in error["message"], error
    assert rig.engine.calls == []
    same = [("authorization", "Bearer sk-acme"), ("x-request-id", "same-1"), ("x-request-id", "same-1")]
    assert rig.client.post("/v1/chat/completions", json=CHAT, headers=same).headers["x-request-id"] == "same-1"
