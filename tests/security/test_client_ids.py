"""Ids and names a client chooses, and later reads back as a URL's ``{id}``: each one the server
stores can be read back by it, and one it could not is a 400 naming it, before anything is stored.

* ids, names and keys (a source id, a message name or tool_call_id, a metadata key, a reviewer) and
  path or query ids refuse control characters (a control character in a path id or the sessions'
  ``user`` was a 404 echoing it);
* a chat's ``metadata.session_id`` holding ``/`` (or being ``.`` / ``..``), an experience id ``.`` /
  ``..`` or one naming a route (``review``), and an ``x-request-id`` ``.`` / ``..`` or naming a
  turns route were acknowledged and could never be read (HTTP clients drop dot segments; ``/``
  and ``%2F`` split the path); a ``metadata.session_id`` of 129-256 characters holding personal
  data was answered while ``GET /v1/sessions/{id}`` refuses such an id;
* ids holding personal data: ``GET /v1/turns?session_id=`` looked a long id up under another key
  than the turn's trace kept; two card-like ``x-request-id`` values were one trace row; an
  experience id holding a card, phone, SSN or IBAN was stored in the clear; a card number right
  after a dash (``s-4111111111111111``) was not masked in the session store, traces and WAL;
* a path id whose %-escapes are not UTF-8 (``/v1/memories/%FF``) was decoded as U+FFFD and looked
  up: a 404 about an id nobody sent;
* ~0.26 % of the server's own experience and request ids held a digit run the masker takes for a
  card or phone number (the memory tier's link to the record lost); generated ids are letters
  only now, and an id of the old hex form still round-trips.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest

from recallserve.serve.api.observe import new_request_id
from recallserve.serve.experience._schema import new_experience_id
from recallserve.serve.pii import pii_kinds
from tests.security.conftest import A, Rig, serving
from tests.unit.edge.conftest import assert_envelope, headers
from tests.unit.experience._records import speed_record

CHAT = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": [{"role": "user", "content": "hi"}]}


_CONTROL_CASES = [
    ("POST", "/v1/memories", {"memories": [{"text": "a note", "source_id": "ticket-1\nFAKE LOG LINE"}]},
     "memories.0.source_id"),
    ("GET", "/v1/memories?source_id=ticket-1%00x", None, "source_id"),
    ("POST", "/v1/chat/completions", {**CHAT, "messages": [{"role": "user", "content": "hi", "name": "Mel\r\nanie"}]},
     "messages.0.name"),
    ("POST", "/v1/chat/completions", {**CHAT, "metadata": {"agent": "off", "a\x00b": "x"}}, "metadata.a\x00b"),
    ("POST", "/v1/chat/completions", {**CHAT, "messages": [
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f", "arguments": "{}"}}]},
        {"role": "tool", "content": "ok", "tool_call_id": "c1\x1b[2J"},
        {"role": "user", "content": "and?"}]}, "messages.2.tool_call_id"),
    ("POST", "/v1/experiences/00000000000000000000000000000000/label", {"label": "correct", "reviewer": "ann\nroot"},
     "reviewer"),
]


@pytest.mark.parametrize(("method", "path", "body", "param"), _CONTROL_CASES,
                         ids=["source_id", "source_id query", "message name", "metadata key", "tool_call_id", "reviewer"])
def test_a_control_character_in_an_id_or_name_is_400_naming_it(shared_rig: Rig, method: str, path: str,
                                                              body: dict[str, Any] | None, param: str) -> None:
    """Ids, names and keys go to logs, traces and store keys, where a newline or NUL forges a line or splits a key."""
    r = shared_rig.client.request(method, path, json=body, headers=headers(A))
    error = assert_envelope(r, 400, param)
    assert "control characters" in error["message"], error


def test_a_plain_name_and_source_id_are_still_accepted(shared_rig: Rig) -> None:
    sid = f"ticket-{uuid.uuid4().hex[:8]}"
    r = shared_rig.client.post("/v1/memories", json={"memories": [{"text": "the kettle was replaced", "source_id": sid}]},
                               headers=headers(A))
    assert r.status_code == 200, r.text
    r = shared_rig.client.get(f"/v1/memories?source_id={sid}", headers=headers(A))
    assert r.status_code == 200 and len(r.json()["data"]) == 1, r.text


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


# ---- ids: sessions, turns, path parameters -----------------------------------------------------

# NOTE: 118 characters, so every route takes it; masked, its text is 118 characters too, over the
# 111 that fit beside the digest in the session store's 128: the key is cut at 128, not at 256.
LONG_SID = "a" * 110 + " j@ex.co"


def test_a_long_session_id_with_personal_data_finds_its_turns(rig: Rig) -> None:
    r = _json(rig, "POST", "/v1/chat/completions", CHAT | {"metadata": {"agent": "off", "session_id": LONG_SID}})
    assert r.status_code == 200, r.text
    turn = r.json()["recallserve"]["request_id"]
    assert _json(rig, "GET", f"/v1/sessions/{quote(LONG_SID)}").status_code == 200
    deadline = time.monotonic() + 30
    while _json(rig, "GET", f"/v1/turns/{turn}").status_code != 200:
        assert time.monotonic() < deadline, "the turn's trace was not stored"
        time.sleep(0.05)
    listed = _json(rig, "GET", "/v1/turns", params={"session_id": LONG_SID})
    assert [t["id"] for t in listed.json()["data"]] == [turn], listed.text


def test_a_session_id_the_sessions_routes_cannot_take_is_400(rig: Rig) -> None:
    sid = "b" * 150 + " jane.doe@example.com"
    r = _json(rig, "POST", "/v1/chat/completions", CHAT | {"metadata": {"agent": "off", "session_id": sid}})
    error = assert_envelope(r, 400, "metadata.session_id")
    assert "at most 128" in error["message"], error
    assert rig.engine.calls == []
    ok = _json(rig, "POST", "/v1/chat/completions", CHAT | {"metadata": {"agent": "off", "session_id": "c" * 128}})
    assert ok.status_code == 200, ok.text


CONTROL_IDS = [
    ("GET", "/v1/memories/a%0Ab", "memory_id"),
    ("DELETE", "/v1/memories/a%00b", "memory_id"),
    ("GET", "/v1/sessions/s%0A1", "session_id"),
    ("POST", "/v1/sessions/s%1B1/summary", "session_id"),
    ("GET", "/v1/sessions/s1?user=u%0A1", "user"),
    ("POST", "/v1/sessions/s1/summary?user=u%7F1", "user"),
    ("GET", "/v1/turns?session_id=s%0D1", "session_id"),
]


@pytest.mark.parametrize(("method", "url", "param"), CONTROL_IDS, ids=[f"{m} {u}" for m, u, _ in CONTROL_IDS])
def test_a_control_character_in_a_path_or_query_id_is_400_naming_it(rig: Rig, method: str, url: str,
                                                                     param: str) -> None:
    error = assert_envelope(rig.client.request(method, url, headers=headers(A)), 400, param)
    assert error["message"].startswith(f"{param}: ") and "control characters" in error["message"], error


@pytest.mark.parametrize("form", ["stored", "v1.2"])
def test_an_experience_id_that_names_a_route_is_400(rig: Rig, form: str) -> None:
    """``GET /v1/experiences/review`` is the review queue: a record created as ``review`` was
    acknowledged (201) and could never be read by its id."""
    if form == "stored":
        body = speed_record(exp_id="review")
    else:
        body = {"version": "1.2", "metadata": {"id": "review", "source_model": "m", "timestamp": "2026-01-01T00:00:00Z"},
                "segments": {"context": {"raw_text": "x"}, "outcome": {"answer": "1"}}}
    error = assert_envelope(_json(rig, "POST", "/v1/experiences", body), 400, "metadata.id")
    assert error["message"].startswith("metadata.id: "), error
    assert _json(rig, "POST", "/v1/experiences", speed_record(exp_id="reviewed")).status_code == 201
    assert _json(rig, "GET", "/v1/experiences/reviewed").status_code == 200


def test_two_request_ids_holding_personal_data_keep_two_readable_traces(rig: Rig) -> None:
    """A turn's trace is keyed by its request id, which was masked to a bare tag: two card-like
    request ids were one ``[CARD_NUMBER]`` row (the first trace replaced), neither readable by its id."""
    ids = ["4111111111111111", "5500005555555559"]
    for rid in ids:
        r = rig.client.post("/v1/chat/completions", json=CHAT, headers={**headers(A), "x-request-id": rid})
        assert r.status_code == 200 and r.json()["recallserve"]["request_id"] == rid, r.text
    deadline = time.monotonic() + 30
    while len(listed := _json(rig, "GET", "/v1/turns").json()["data"]) < 2:
        assert time.monotonic() < deadline, listed
        time.sleep(0.05)
    keys = [t["id"] for t in listed]
    assert len(set(keys)) == 2 and not any(rid in str(listed) for rid in ids), keys
    for rid in ids:
        got = _json(rig, "GET", f"/v1/turns/{rid}")
        assert got.status_code == 200 and rid not in got.text, got.text
    for key in keys:  # NOTE: the console opens a turn by the id its list shows
        assert _json(rig, "GET", f"/v1/turns/{quote(key)}").status_code == 200, key


def test_a_request_id_that_names_a_turns_route_is_a_400_naming_the_header(rig: Rig) -> None:
    """``x-request-id: sessions`` kept the turn under ``sessions``, and ``GET /v1/turns/sessions`` is the
    session list: the trace could never be read by its id. Such an id is refused like a malformed one."""
    r = rig.client.post("/v1/chat/completions", json=CHAT, headers={**headers(A), "x-request-id": "sessions"})
    error = assert_envelope(r, 400, "x-request-id")
    assert "names a route" in error["message"], error
    r = rig.client.post("/v1/chat/completions", json=CHAT, headers={**headers(A), "x-request-id": "sessions-2"})
    assert r.status_code == 200 and r.json()["recallserve"]["request_id"] == "sessions-2", r.text


def _until(check: Any, timeout_s: float = 10.0) -> Any:
    """``check()`` once truthy (polled), else its last value."""
    deadline = time.monotonic() + timeout_s
    while not (got := check()) and time.monotonic() < deadline:
        time.sleep(0.05)
    return got


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


def _experience(exp_id: str | None = None) -> dict[str, Any]:
    rec = speed_record(timestamp=1.7e9)
    if exp_id is not None:
        rec["metadata"]["id"] = exp_id
    return rec


def _chat(rig: Rig, session_id: str, text: str = "hello", tenant: str = A, **extra: str) -> Any:
    body = {"model": "recallserve", "user": "u1", "metadata": {"session_id": session_id, "agent": "off"},
            "messages": [{"role": "user", "content": text}]}
    return rig.client.post("/v1/chat/completions", json=body, headers=headers(tenant, **extra))


# ---- a path id that is not UTF-8 --------------------------------------------------------------------

@pytest.mark.parametrize(("method", "url", "param"), [
    ("GET", "/v1/memories/%FF", "memory_id"),
    ("DELETE", "/v1/memories/ab%ED%A0%80", "memory_id"),
    ("GET", "/v1/sessions/%C3", "session_id"),
    ("POST", "/v1/sessions/s%FF/summary", "session_id"),
    ("GET", "/v1/experiences/%FF", "exp_id"),
    ("GET", "/v1/turns/%FE", "turn_id"),
])
def test_a_path_id_that_is_not_utf8_is_400_naming_it(rig: Rig, method: str, url: str, param: str) -> None:
    r = _json(rig, method, url)
    assert r.status_code == 400, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(f"{param}: ") and "UTF-8" in err["message"], err
    assert "\ufffd" not in r.text


def test_a_utf8_escaped_path_id_is_still_read(rig: Rig) -> None:
    assert _chat(rig, "café").status_code == 200
    r = rig.client.get("/v1/sessions/caf%C3%A9", params={"user": "u1"}, headers=headers(A))
    assert r.status_code == 200 and r.json()["id"] == "café", r.text


# ---- ids and personal data ----------------------------------------------------------------------------

@pytest.mark.parametrize(("exp_id", "kind"), [("4111111111111111", "card_number"), ("415-555-0100", "phone"),
                                              ("123-45-6789", "id_number"), ("DE89370400440532013000", "iban")])
def test_an_experience_id_holding_personal_data_is_400_and_not_stored(tmp_path: Path, exp_id: str, kind: str) -> None:
    with serving(tmp_path) as rig:
        r = _json(rig, "POST", "/v1/experiences", _experience(exp_id))
        assert r.status_code == 400, r.text
        err = r.json()["error"]
        assert err["param"] == "metadata.id" and kind in err["message"], err
        assert _json(rig, "GET", f"/v1/experiences/{exp_id}").status_code == 404
        assert _json(rig, "POST", "/v1/experiences", _experience("exp-plain-1")).status_code == 201
    assert not _raw_files(tmp_path, exp_id.encode())


def _raw_files(root: Path, raw: bytes) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes())


def test_a_card_number_after_a_dash_is_masked_and_its_session_still_read(tmp_path: Path) -> None:
    sid, card = "s-4111111111111111", b"4111111111111111"
    with serving(tmp_path) as rig:
        assert _chat(rig, sid, "hello").status_code == 200
        r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "paid with card-4111111111111111 today"}]})
        assert r.status_code == 200, r.text
        got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()
        assert got["text"] == "paid with card-[CARD_NUMBER] today", got
        s = rig.client.get(f"/v1/sessions/{sid}", params={"user": "u1"}, headers=headers(A))
        assert s.status_code == 200 and s.json()["message_count"] == 2, s.text
        turns = rig.client.get("/v1/turns", params={"session_id": sid}, headers=headers(A)).json()["data"]
        assert len(turns) == 1 and "4111111111111111" not in str(turns), turns
        # NOTE: business ids after a dash, and a dashed date after one, stay as they are.
        kept = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "T-88 order-104208 2024-01-15"}]})
        assert _json(rig, "GET", f"/v1/memories/{kept.json()['ids'][0]}").json()["text"] == "T-88 order-104208 2024-01-15"
    assert not _raw_files(tmp_path, card)


def test_an_id_of_the_servers_old_hex_form_still_round_trips(rig: Rig) -> None:
    # NOTE: an id this server generated before (24 hex digits, here one the masker reads as a card
    # number): a client posting its v1.2 export back is not refused.
    old = "exp_f282b5084604431588618310"
    assert pii_kinds(old)
    assert _json(rig, "POST", "/v1/experiences", _experience(old)).status_code == 201
    assert _json(rig, "GET", f"/v1/experiences/{old}").json()["record"]["metadata"]["id"] == old


def test_generated_ids_hold_no_personal_data() -> None:
    # NOTE: 0.26 % of the former hex ids were card- or phone-like: 20,000 draws held ~50 of them.
    assert not [i for i in (new_experience_id() for _ in range(20_000)) if pii_kinds(i)]
    assert not [i for i in (new_request_id() for _ in range(20_000)) if pii_kinds(i)]


def test_a_generated_id_is_the_id_the_memory_tier_and_the_turn_list_show(rig: Rig) -> None:
    r = _json(rig, "POST", "/v1/experiences", _experience())
    assert r.status_code == 201, r.text
    exp_id = r.json()["record"]["metadata"]["id"]
    assert not any(c.isdigit() for c in exp_id.removeprefix("exp_")), exp_id
    mems = _json(rig, "GET", "/v1/memories", params={"source_id": f"experience:{exp_id}:context"}).json()["data"]
    assert [m["metadata"]["experience_id"] for m in mems] == [exp_id], mems
    r = _chat(rig, "s-ids")
    assert r.status_code == 200, r.text
    request_id = r.headers["x-request-id"]
    # NOTE: the turn's trace is stored after the answer (in the background): polled, bounded.
    listed = _until(lambda: rig.client.get("/v1/turns", params={"session_id": "s-ids"}, headers=headers(A)).json()["data"])
    assert [t["id"] for t in listed] == [request_id], listed
