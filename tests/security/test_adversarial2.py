"""A second adversarial pass over the HTTP API: what the other files of tests/security left open.

* a made-up HTTP method must not mint a new ``/metrics`` series (label cardinality);
* a JSON object naming a key twice is a 400 naming the key, on every body route, and stores nothing;
* a compressed body (``content-encoding: gzip``) is a 415 naming the header, never decompressed;
* an add batch's text is bounded in all, not only per field;
* ids, names and keys (a source id, a message name or tool_call_id, a metadata key, a reviewer) refuse
  control characters;
* a message built to make the entity table quadratic (tens of thousands of e-mail-like tokens,
  amounts or title abbreviations) is answered in bounded time.
"""

from __future__ import annotations

import gzip
import json
import time
import uuid
from typing import Any

import pytest

from recallserve.serve.api.metrics import render_metrics
from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import assert_envelope, headers

CHAT = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": [{"role": "user", "content": "hi"}]}


@pytest.mark.parametrize("path", ["/healthz", "/v1/no-such-route", "/v1/memories"])
def test_a_made_up_method_adds_no_metric_series(shared_rig: Rig, path: str) -> None:
    method = f"PROBE{uuid.uuid4().hex[:12].upper()}"
    r = shared_rig.client.request(method, path, headers=headers(A))
    assert 400 <= r.status_code < 500, r.text
    text = render_metrics().decode()
    assert method not in text
    assert 'method="OTHER"' in text


def _raw(value: dict[str, Any], dup: str, first: Any) -> bytes:
    """``value`` as JSON with ``dup``'s key given twice: ``first`` before the real value."""
    text = json.dumps(value)
    parent, _, key = dup.rpartition(".")
    needle = f'"{key}": '
    at = text.index(needle) if not parent else text.index(needle, text.index(f'"{parent.split(".")[0]}"'))
    return (text[:at] + f"{needle}{json.dumps(first)}, " + text[at:]).encode()


DUPLICATES = [
    ("/v1/chat/completions", CHAT, "model", "gpt-4o"),
    ("/v1/chat/completions", CHAT, "messages.0.role", "system"),
    ("/v1/chat/completions", {**CHAT, "metadata": {"agent": "off", "session_id": "s1"}}, "metadata.session_id", "s2"),
    ("/v1/memories", {"memories": [{"text": "Acme's code word is PELICAN", "source_id": "dup:1"}]},
     "memories.0.source_id", "dup:0"),
    ("/v1/memories/search", {"query": "code word", "k": 5}, "k", 1),
    ("/v1/experiences/search", {"query": "speed", "source_model": "m1"}, "source_model", "m0"),
]


@pytest.mark.parametrize(("path", "body", "dup", "first"), DUPLICATES, ids=[f"{p} {d}" for p, _, d, _ in DUPLICATES])
def test_a_key_given_twice_is_400_naming_it(shared_rig: Rig, path: str, body: dict[str, Any], dup: str,
                                            first: Any) -> None:
    raw = _raw(body, dup, first)
    assert json.loads(raw) == body, raw  # NOTE: Python's parser keeps the last: the body it answered before
    r = shared_rig.client.post(path, content=raw, headers=headers(A, **{"content-type": "application/json"}))
    err = assert_envelope(r, 400, dup)
    assert "twice" in err["message"] and err["message"].startswith(f"{dup}:"), err


def test_a_memory_batch_with_a_key_twice_stores_nothing(rig: Rig) -> None:
    body = {"memories": [{"text": "globex must not see this", "source_id": "dup:2"}]}
    r = rig.client.post("/v1/memories", content=_raw(body, "memories.0.text", "first text"),
                        headers=headers(A, **{"content-type": "application/json"}))
    assert_envelope(r, 400, "memories.0.text")
    listed = rig.client.get("/v1/memories", params={"source_id": "dup:2"}, headers=headers(A))
    assert listed.status_code == 200 and listed.json()["data"] == [], listed.text


def test_the_same_key_in_two_objects_is_fine(shared_rig: Rig) -> None:
    body = {**CHAT, "messages": [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"},
                                 {"role": "user", "content": "c"}]}
    r = shared_rig.client.post("/v1/chat/completions", json=body, headers=headers(A))
    assert r.status_code == 200, r.text


# NOTE: each is one message of about 200,000 characters (the per-message cap): before the fix the
# e-mail run alone kept the event loop busy for minutes (an overlap check over every span taken,
# and each entity's snippet masking the whole text again).
HOSTILE_TEXTS = {
    "emails": "a@b." * 49_000,
    "amounts": " ".join(f"${i}" for i in range(30_000)),
    "titles": "Dr. " * 49_000,
}


@pytest.mark.parametrize("session", [False, True], ids=["sessionless", "session"])
@pytest.mark.parametrize("kind", sorted(HOSTILE_TEXTS))
def test_an_entity_heavy_message_is_answered_in_bounded_time(rig: Rig, kind: str, session: bool) -> None:
    meta = {"agent": "off"} | ({"session_id": f"hostile-{kind}"} if session else {})
    body = {**CHAT, "metadata": meta, "messages": [{"role": "user", "content": HOSTILE_TEXTS[kind]}]}
    start = time.monotonic()
    r = rig.client.post("/v1/chat/completions", json=body, headers=headers(A))
    elapsed = time.monotonic() - start
    # NOTE: a 400 (the message does not fit the context window) is an answer too; a 5xx is not.
    assert r.status_code < 500, r.text
    # NOTE: ~1-3 s on the 2-core host (linear in the text); the quadratic scan took minutes.
    assert elapsed < 20, f"{kind}: {elapsed:.1f} s"


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


@pytest.mark.parametrize("encoding", ["gzip", "deflate", "br", "GZIP", "gzip, identity"])
def test_a_compressed_body_is_415_naming_the_header(shared_rig: Rig, encoding: str) -> None:
    raw = gzip.compress(json.dumps(CHAT).encode())
    r = shared_rig.client.post("/v1/chat/completions", content=raw,
                               headers=headers(A, **{"content-type": "application/json", "content-encoding": encoding}))
    err = assert_envelope(r, 415, "content-encoding")
    assert err["message"].startswith("content-encoding:"), err


def test_an_identity_encoded_body_is_read(shared_rig: Rig) -> None:
    r = shared_rig.client.post("/v1/chat/completions", content=json.dumps(CHAT).encode(),
                               headers=headers(A, **{"content-type": "application/json", "content-encoding": "identity"}))
    assert r.status_code == 200, r.text


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


@pytest.mark.parametrize("value", ["Bearer\tsk-a", "Basic dXNlcjpwYXNz", "Bearer", "Bearer   ", "sk-a"])
def test_an_authorization_header_of_another_form_is_named(shared_rig: Rig, value: str) -> None:
    r = shared_rig.client.post("/v1/memories/search", json={"query": "kettle"}, headers={"Authorization": value})
    error = assert_envelope(r, 401, "authorization")
    assert error["code"] == "invalid_authorization" and "Bearer <key>" in error["message"], error


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
