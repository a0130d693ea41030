"""How a request body is read: the JSON a route takes, in the encodings JSON allows, and no body
where a route reads none.

* a JSON object naming a key twice is a 400 naming the key, on every body route, and stores nothing;
* a compressed body (``content-encoding: gzip``) is a 415 naming the header, never decompressed;
* a JSON body that is not UTF-8 (UTF-16 / UTF-32, which the parser reads) or that carries a UTF-8
  encoded surrogate reached the stores with a lone surrogate: the check looked for ``\\ud800``
  escapes in UTF-8 bytes only; now a 400 naming the field, and a valid body in those encodings
  is still read;
* a body sent to a route that reads none was dropped behind a 2xx: ``POST
  /v1/sessions/{id}/summary`` with ``{"text": ...}`` answered "refreshed", ``DELETE`` with a body
  of ids deleted the path's id only; each is a 400 now (an empty JSON object is fine).
"""

from __future__ import annotations

import gzip
import json
from typing import Any

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import assert_envelope, headers

CHAT = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": [{"role": "user", "content": "hi"}]}


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


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


# ---- bodies in other encodings ------------------------------------------------------------------

def _lone_surrogate_bodies() -> list[Any]:
    memory = json.dumps({"memories": [{"text": "lone \ud800 here", "source_id": "sur-1"}]})
    chat = json.dumps(CHAT | {"messages": [{"role": "user", "content": "x \udc00 y"}]})
    out = []
    for encoding in ("utf-16", "utf-16-le", "utf-32"):
        out.append(pytest.param("/v1/memories", memory.encode(encoding), "memories.0.text", id=f"memory {encoding}"))
        out.append(pytest.param("/v1/chat/completions", chat.encode(encoding), "messages.0.content", id=f"chat {encoding}"))
    # NOTE: a surrogate's UTF-8 form (ED A0 80): not UTF-8, yet Python's JSON parser decodes bytes
    # with "surrogatepass", so it became a lone surrogate without any escape in the body.
    out.append(pytest.param("/v1/memories", b'{"memories": [{"text": "a\xed\xa0\x80b", "source_id": "sur-1"}]}',
                            "memories.0.text", id="memory utf-8 encoded surrogate"))
    out.append(pytest.param("/v1/memories/search", b'{"query": "a\xed\xb0\x80b"}', "query", id="search utf-8 encoded surrogate"))
    return out


@pytest.mark.parametrize(("path", "raw", "field"), _lone_surrogate_bodies())
def test_a_lone_surrogate_in_any_encoding_is_400_naming_the_field(rig: Rig, path: str, raw: bytes, field: str) -> None:
    r = rig.client.post(path, content=raw, headers={**headers(A), "content-type": "application/json"})
    assert "surrogate" in assert_envelope(r, 400, field)["message"]
    assert _json(rig, "GET", "/v1/memories", params={"source_id": "sur-1"}).json()["data"] == []
    assert rig.engine.calls == []


@pytest.mark.parametrize("encoding", ["utf-16", "utf-32", "utf-8-sig"])
def test_a_valid_body_in_another_json_encoding_is_still_read(rig: Rig, encoding: str) -> None:
    raw = json.dumps({"memories": [{"text": "the kettle was replaced", "source_id": f"enc-{encoding}"}]}).encode(encoding)
    r = rig.client.post("/v1/memories", content=raw, headers={**headers(A), "content-type": "application/json"})
    assert r.status_code == 200, r.text


def _chat(rig: Rig, session_id: str, text: str = "hello", tenant: str = A, **extra: str) -> Any:
    body = {"model": "recallserve", "user": "u1", "metadata": {"session_id": session_id, "agent": "off"},
            "messages": [{"role": "user", "content": text}]}
    return rig.client.post("/v1/chat/completions", json=body, headers=headers(tenant, **extra))


# ---- a body sent to a route that reads none ---------------------------------------------------------

def test_a_body_on_delete_is_400_and_deletes_nothing(rig: Rig) -> None:
    mid = _json(rig, "POST", "/v1/memories", {"memories": [{"text": "keep me"}]}).json()["ids"][0]
    r = _json(rig, "DELETE", f"/v1/memories/{mid}", {"ids": [mid, "another"]})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body", r.text
    assert _json(rig, "GET", f"/v1/memories/{mid}").status_code == 200
    assert _json(rig, "DELETE", f"/v1/memories/{mid}").status_code == 200  # the positive control
    assert _json(rig, "GET", f"/v1/memories/{mid}").status_code == 404


def test_a_body_on_a_summary_refresh_is_400_and_refreshes_nothing(rig: Rig) -> None:
    assert _chat(rig, "s-sum").status_code == 200
    url = "/v1/sessions/s-sum/summary?user=u1"
    r = _json(rig, "POST", url, {"text": "the summary I want"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body", r.text
    got = rig.client.get("/v1/sessions/s-sum", params={"user": "u1"}, headers=headers(A)).json()
    assert got["summary"]["until_seq"] == -1, got
    r = _json(rig, "POST", url)
    assert r.status_code == 200 and r.json()["refreshed"] is True, r.text


def test_an_empty_json_object_on_a_bodyless_route_is_fine(rig: Rig) -> None:
    assert _chat(rig, "s-empty").status_code == 200
    r = _json(rig, "POST", "/v1/sessions/s-empty/summary?user=u1", {})
    assert r.status_code == 200 and r.json()["refreshed"] is True, r.text


def test_a_get_with_a_body_is_400(rig: Rig) -> None:
    r = rig.client.request("GET", "/v1/turns", content=b'{"session_id": "s1"}',
                           headers={**headers(A), "content-type": "application/json"})
    assert r.status_code == 400 and r.json()["error"]["param"] == "body", r.text
