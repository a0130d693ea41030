"""Personal data inside a memory's ``source_id`` (the dedup key) under the default policy: masked
before it is stored, yet two different ids stay two keys.

The masker turned every e-mail into the same ``[EMAIL]``, so the memory of ``bob@example.com``
replaced the acknowledged memory of ``alice@example.com`` (a 200 with an id, then a 404 for it),
and ``GET /v1/memories?source_id=`` with the id the client sent found nothing. The chat write-back's
key (``chat:<user>:<request id>``) did the same to two users with e-mail user ids.
"""

from __future__ import annotations

import pytest

from recallserve.serve.pii import mask_id
from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import RAW, headers, wait_for_source

PAIRS = {
    "e-mail": ("alice@example.com", "bob@example.com"),
    "phone": ("crm:+1 415 555 0100", "crm:+1 415 555 0199"),
    "card": ("card:4111 1111 1111 1111", "card:5555 5555 5555 4444"),
    "ssn": ("ssn:123-45-6789", "ssn:987-65-4321"),
}


def _add(rig: Rig, text: str, source_id: str) -> str:
    r = rig.client.post("/v1/memories", headers=headers(A), json={"memories": [{"text": text, "source_id": source_id}]})
    assert r.status_code == 200, r.text
    return r.json()["ids"][0]


@pytest.mark.parametrize("kind", PAIRS)
def test_two_ids_with_personal_data_stay_two_memories(rig: Rig, kind: str) -> None:
    first, second = PAIRS[kind]
    one, two = _add(rig, "first note", first), _add(rig, "second note", second)
    for memory_id, text in ((one, "first note"), (two, "second note")):
        got = rig.client.get(f"/v1/memories/{memory_id}", headers=headers(A))
        assert got.status_code == 200 and got.json()["text"] == text, got.text  # acknowledged, not replaced
        assert [r for r in RAW + [first, second] if r in got.text] == [], got.text
    for source_id, memory_id in ((first, one), (second, two)):
        listed = rig.client.get("/v1/memories", params={"source_id": source_id}, headers=headers(A)).json()["data"]
        assert [m["id"] for m in listed] == [memory_id], listed
        # NOTE: the key the API returned finds the memory too (a masked id masks to itself).
        again = rig.client.get("/v1/memories", params={"source_id": listed[0]["source_id"]}, headers=headers(A))
        assert [m["id"] for m in again.json()["data"]] == [memory_id], again.text


def test_a_masked_key_holds_no_digits_the_masker_could_take_for_a_number() -> None:
    for i in range(2000):
        key = mask_id(f"user{i}@example.com")
        assert mask_id(key) == key and not any(c.isdigit() for c in key.split("~")[-1]), key


def test_the_same_id_still_deduplicates(rig: Rig) -> None:
    """The positive control: one raw id is one key, so a newer memory replaces the older."""
    old, new = _add(rig, "old note", "alice@example.com"), _add(rig, "new note", "alice@example.com")
    assert rig.client.get(f"/v1/memories/{old}", headers=headers(A)).status_code == 404
    listed = rig.client.get("/v1/memories", params={"source_id": "alice@example.com"}, headers=headers(A)).json()["data"]
    assert [m["id"] for m in listed] == [new]


def test_chat_write_backs_of_two_users_with_e_mail_ids_both_kept(rig: Rig) -> None:
    for user in ("alice@example.com", "bob@example.com"):
        r = rig.client.post("/v1/chat/completions", headers=headers(A, **{"x-request-id": "req-same"}), json={
            "model": "recallserve", "user": user, "metadata": {"agent": "off"},
            "messages": [{"role": "user", "content": f"I decided to cancel order 104208, says {user.split('@')[0]}."}]})
        assert r.status_code == 200, r.text
    for user in ("alice", "bob"):
        # NOTE: the write-back's key is made of the user's masked key (the session store's too).
        stored = wait_for_source(rig.client, A, f"chat:{mask_id(user + '@example.com')}:req-same")
        assert len(stored) == 1 and f"says {user}" in stored[0]["text"], stored
        assert "@example.com" not in str(stored), stored


def _session_turn(rig: Rig, user: str, session_id: str, text: str, key: str = "sk-acme") -> str:
    r = rig.client.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={
        "model": "recallserve", "user": user, "metadata": {"agent": "off", "session_id": session_id},
        "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text
    return r.json()["recallserve"]["request_id"]


def test_user_and_session_ids_with_personal_data_are_stored_masked_and_kept_apart(rig: Rig, tmp_path) -> None:  # type: ignore[no-untyped-def]
    """The session store kept ``user`` and ``session_id`` verbatim (an e-mail on disk), and the
    turn traces masked both sessions' ids to one ``[EMAIL]``: two sessions listed as one."""
    import time

    sessions = {"alice@example.com": "case-alice@example.com", "bob@example.com": "case-bob@example.com"}
    turns = {user: _session_turn(rig, user, sid, f"I decided to cancel order 104208, says {user[:3]}.")
             for user, sid in sessions.items()}
    for user, sid in sessions.items():
        got = rig.client.get(f"/v1/sessions/{sid}", params={"user": user}, headers=headers(A))
        assert got.status_code == 200 and got.json()["message_count"] == 2, got.text
        assert "@example.com" not in got.text, got.text
        refreshed = rig.client.post(f"/v1/sessions/{sid}/summary", params={"user": user}, headers=headers(A))
        assert refreshed.status_code == 200, refreshed.text
    # NOTE: the other user's id with this session id is another (unused) session.
    assert rig.client.get("/v1/sessions/case-alice@example.com", params={"user": "bob@example.com"},
                          headers=headers(A)).status_code == 404
    deadline = time.monotonic() + 30
    for user, sid in sessions.items():
        while (listed := rig.client.get("/v1/turns", params={"session_id": sid}, headers=headers(A)).json()["data"]) == []:
            assert time.monotonic() < deadline, "the turn's trace was not stored"
            time.sleep(0.05)
        assert [t["id"] for t in listed] == [turns[user]], listed
    traced = rig.client.get("/v1/turns/sessions", headers=headers(A))
    assert len(traced.json()["data"]) == 2 and "@example.com" not in traced.text, traced.text
    on_disk = [p for p in tmp_path.rglob("*") if p.is_file() and b"@example.com" in p.read_bytes()]
    assert on_disk == [], on_disk


def test_a_session_id_with_personal_data_is_refused_under_reject(rig: Rig) -> None:
    from tests.unit.edge.conftest import assert_envelope

    r = rig.client.post("/v1/chat/completions", headers={"Authorization": "Bearer sk-strict"}, json={
        "model": "recallserve", "metadata": {"agent": "off", "session_id": "case-alice@example.com"},
        "messages": [{"role": "user", "content": "hello"}]})
    assert assert_envelope(r, 400, "metadata.session_id")["code"] == "personal_data"
