"""Text that is not valid Unicode: a JSON string may escape half of a UTF-16 surrogate pair
(``"\\ud800"``), which no UTF-8 store, log line or tokenizer can encode. Each string and map key
of every route's valid body, given one, is a 400 naming that field before anything is stored
(it was a 500 from the session store, the WAL's metadata and the experience store, or a record
written that could not be read back). A proper pair (an emoji's escape) is text like any other.
"""

from __future__ import annotations

import json

import pytest

from tests.security.conftest import Rig
from tests.security.test_inputs import VALID, _nodes, _replaced, _url
from tests.unit.edge.conftest import assert_envelope, headers
from tests.unit.experience._records import speed_record

LONE = "\ud800"


def _cases() -> list[object]:
    out = []
    for route, body in VALID.items():
        for where, value in _nodes(body):
            name = ".".join(map(str, where))
            if isinstance(value, str):
                out.append(pytest.param(route, _replaced(body, where, value + LONE), name, id=f"{route[1]} {name}"))
            elif isinstance(value, dict) and where:
                out.append(pytest.param(route, _replaced(body, where, value | {"k" + LONE: "x"}), name,
                                        id=f"{route[1]} {name} key"))
    return out


def _send(rig: Rig, route: tuple[str, str], body: dict):  # type: ignore[no-untyped-def]
    # NOTE: json.dumps writes a lone surrogate as its \\ud800 escape, as a client's encoder does.
    return rig.client.request(route[0], _url(route[1]), content=json.dumps(body),
                              headers={**headers("acme"), "content-type": "application/json"})


@pytest.mark.parametrize(("route", "body", "field"), _cases())
def test_a_lone_surrogate_is_400_naming_the_field(shared_rig: Rig, route: tuple[str, str], body: dict,
                                                  field: str) -> None:
    if route[1].endswith("/label"):
        shared_rig.client.post("/v1/experiences", json=speed_record(exp_id="exp-1"), headers=headers("acme"))
    error = assert_envelope(_send(shared_rig, route, body), 400, field)
    assert field in error["message"] and "surrogate" in error["message"], error


def test_nothing_with_a_lone_surrogate_was_stored(rig: Rig) -> None:
    body = {"memories": [{"text": "ticket T-88", "source_id": "u:1", "metadata": {"note": "x" + LONE}}]}
    assert_envelope(_send(rig, ("POST", "/v1/memories"), body), 400, "memories.0.metadata.note")
    listed = rig.client.get("/v1/memories", params={"source_id": "u:1"}, headers=headers("acme"))
    assert listed.status_code == 200 and listed.json()["data"] == [], listed.text


def test_a_surrogate_pair_is_ordinary_text(rig: Rig) -> None:
    """The positive control: the escape of a pair (U+1F600) decodes to one valid character."""
    raw = b'{"memories": [{"text": "grinder jammed \\ud83d\\ude00", "source_id": "u:2"}]}'
    r = rig.client.post("/v1/memories", content=raw, headers={**headers("acme"), "content-type": "application/json"})
    assert r.status_code == 200, r.text
    got = rig.client.get(f"/v1/memories/{r.json()['ids'][0]}", headers=headers("acme")).json()
    assert got["text"] == "grinder jammed \U0001F600"
    chat = rig.client.post("/v1/chat/completions", headers={**headers("acme"), "content-type": "application/json"},
                           content=json.dumps({
        "model": "recallserve", "user": "u1", "metadata": {"session_id": "s1", "agent": "off"},
        "messages": [{"role": "user", "content": "I decided to keep order 104208 \U0001F600"}]}, ensure_ascii=True))
    assert chat.status_code == 200, chat.text


def test_a_nul_in_a_session_message_is_stored_on_either_backend(rig: Rig) -> None:
    """SQLite stores a NUL and PostgreSQL's text cannot: the turn is answered and kept on both
    (U+FFFD in PostgreSQL), never a 500 on one backend only."""
    body = {"model": "recallserve", "metadata": {"agent": "off", "session_id": "nul-1"},
            "messages": [{"role": "user", "content": "order 104208\x00 status?"}]}
    r = rig.client.post("/v1/chat/completions", json=body, headers=headers("acme"))
    assert r.status_code == 200, r.text
    # the next turn's prompt carries the stored message back from the session
    again = {**body, "messages": [{"role": "user", "content": "And the refund?"}]}
    r = rig.client.post("/v1/chat/completions", json=again, headers=headers("acme"))
    assert r.status_code == 200, r.text
    last = rig.prompts()[-1]
    assert "And the refund?" in last and "104208" in last and "status?" in last, last
