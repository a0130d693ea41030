"""Every route with a second tenant's key: no read, write, delete or existence oracle.

The routes come from the app's OpenAPI document: a route without a probe here fails
:func:`test_every_route_has_a_cross_tenant_probe` by name. Each probe first shows the positive
case (the owner sees its data), so a probe cannot pass because nothing was there to leak, then
that globex's answer about acme's data is the answer about data that does not exist.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import pytest

from tests.security.conftest import NO_TENANT_DATA, TEST_ONLY, A, B, Rig, normalised, routes
from tests.unit.edge.conftest import headers, wait_for_source
from tests.unit.experience._records import speed_record

SECRET = "Acme's vault code word is PELICAN-77 for ticket T-88"
MODEL = "qwen2.5-7b"
FRESH_MEMORY = "0" * 32  # NOTE: a well-formed id nobody holds (memory ids are 32 hex characters)
PROBES: dict[tuple[str, str], Callable[[Rig], None]] = {}


def probe(method: str, path: str) -> Callable[[Callable[[Rig], None]], Callable[[Rig], None]]:
    def register(fn: Callable[[Rig], None]) -> Callable[[Rig], None]:
        PROBES[(method, path)] = fn
        return fn
    return register


def _memory(rig: Rig, tenant: str, text: str = SECRET, source_id: str = "doc:1") -> str:
    r = rig.client.post("/v1/memories", headers=headers(tenant),
                        json={"memories": [{"text": text, "source_id": source_id}]})
    assert r.status_code == 200, r.text
    return r.json()["ids"][0]


def _experience(rig: Rig, tenant: str, answer: str = "95 km/h", exp_id: str | None = None) -> str:
    # NOTE: a wrong answer fails the record's checks -> low confidence -> the review tier. The
    # problem's own numbers stay in the text: a right answer's checks are then grounded (active tier).
    body = speed_record(answer=answer, text=f"{SECRET}. A car drives 120 km in 1.5 h. What is its speed?",
                        model=MODEL, exp_id=exp_id)
    r = rig.client.post("/v1/experiences", headers=headers(tenant), json=body)
    assert r.status_code == 201, r.text
    return r.json()["record"]["metadata"]["id"]


def _same_as_fresh(rig: Rig, method: str, url: str, owned: str, fresh: str, **kw: Any) -> tuple[int, Any]:
    """globex's answer for acme's id ``owned`` equals its answer for the unused id ``fresh``."""
    theirs = rig.client.request(method, url.format(owned), headers=headers(B), **kw)
    nobody = rig.client.request(method, url.format(fresh), headers=headers(B), **kw)
    assert normalised(theirs, owned) == normalised(nobody, fresh), (theirs.text, nobody.text)
    return theirs.status_code, theirs.json()


@probe("POST", "/v1/memories")
def _upsert(rig: Rig) -> None:
    mine = _memory(rig, A)
    theirs = _memory(rig, B, "globex overwrite attempt", source_id="doc:1")  # same dedup key
    assert theirs != mine
    got = rig.client.get(f"/v1/memories/{mine}", headers=headers(A)).json()
    assert got["text"] == SECRET, got
    listed = rig.client.get("/v1/memories", params={"source_id": "doc:1"}, headers=headers(A)).json()["data"]
    assert [m["text"] for m in listed] == [SECRET]


@probe("GET", "/v1/memories")
def _by_source(rig: Rig) -> None:
    _memory(rig, A)
    assert wait_for_source(rig.client, A, "doc:1")
    used, fresh = (rig.client.get("/v1/memories", params={"source_id": s}, headers=headers(B))
                   for s in ("doc:1", "doc:never"))
    assert used.status_code == 200 and used.json()["data"] == [], used.text
    assert normalised(used, "doc:1") == normalised(fresh, "doc:never")


@probe("POST", "/v1/memories/search")
def _search(rig: Rig) -> None:
    mine = _memory(rig, A)
    body = {"query": SECRET, "threshold": -1, "k": 50}
    assert mine in [h["id"] for h in rig.client.post("/v1/memories/search", json=body, headers=headers(A)).json()["data"]]
    r = rig.client.post("/v1/memories/search", json=body, headers=headers(B))
    assert r.status_code == 200 and "PELICAN" not in r.text and mine not in r.text, r.text


@probe("GET", "/v1/memories/{memory_id}")
def _get_memory(rig: Rig) -> None:
    mine = _memory(rig, A)
    assert rig.client.get(f"/v1/memories/{mine}", headers=headers(A)).status_code == 200
    status, _ = _same_as_fresh(rig, "GET", "/v1/memories/{}", mine, FRESH_MEMORY)
    assert status == 404


@probe("DELETE", "/v1/memories/{memory_id}")
def _delete_memory(rig: Rig) -> None:
    mine = _memory(rig, A)
    status, _ = _same_as_fresh(rig, "DELETE", "/v1/memories/{}", mine, FRESH_MEMORY)
    assert status == 404
    assert rig.client.get(f"/v1/memories/{mine}", headers=headers(A)).json()["text"] == SECRET


@probe("POST", "/v1/experiences")
def _create_experience(rig: Rig) -> None:
    mine = _experience(rig, A)
    # NOTE: the client may choose the id: globex reusing acme's is a write to globex's own record.
    assert _experience(rig, B, answer="80 km/h", exp_id=mine) == mine
    assert _experience(rig, B, answer="80 km/h", exp_id="exp-never-used") == "exp-never-used"
    got = rig.client.get(f"/v1/experiences/{mine}", headers=headers(A)).json()
    assert got["record"]["outcome"]["answer"] == "95 km/h" and got["tier"] == "review", got
    assert rig.client.get("/v1/experiences/exp-never-used", headers=headers(A)).status_code == 404


@probe("GET", "/v1/experiences/review")
def _review(rig: Rig) -> None:
    mine = _experience(rig, A)
    assert mine in rig.client.get("/v1/experiences/review", headers=headers(A)).text
    r = rig.client.get("/v1/experiences/review", headers=headers(B))
    assert r.status_code == 200 and r.json() == [], r.text


@probe("POST", "/v1/experiences/search")
def _search_experiences(rig: Rig) -> None:
    mine = _experience(rig, A, answer="80 km/h")
    body = {"query": SECRET, "source_model": MODEL, "k": 50, "archival_k": 50, "topic_prefix": "physics"}
    assert mine in rig.client.post("/v1/experiences/search", json=body, headers=headers(A)).text
    r = rig.client.post("/v1/experiences/search", json=body, headers=headers(B))
    assert r.status_code == 200 and r.json() == {"hits": [], "archival": [], "conflicts": []}, r.text


@probe("GET", "/v1/experiences/{exp_id}")
def _get_experience(rig: Rig) -> None:
    mine = _experience(rig, A)
    status, _ = _same_as_fresh(rig, "GET", "/v1/experiences/{}", mine, "exp-never-used")
    assert status == 404


@probe("POST", "/v1/experiences/{exp_id}/label")
def _label_experience(rig: Rig) -> None:
    mine = _experience(rig, A)
    status, _ = _same_as_fresh(rig, "POST", "/v1/experiences/{}/label", mine, "exp-never-used",
                               json={"label": "correct"})
    assert status == 404
    assert rig.client.get(f"/v1/experiences/{mine}", headers=headers(A)).json()["tier"] == "review"


def _chat(rig: Rig, tenant: str, text: str, session_id: str | None = None) -> Any:
    meta = {"agent": "off"} | ({"session_id": session_id} if session_id else {})
    return rig.client.post("/v1/chat/completions", headers=headers(tenant),
                           json={"model": "recallserve", "user": "u1", "metadata": meta,
                                 "messages": [{"role": "user", "content": text}]})


@probe("POST", "/v1/chat/completions")
def _chat_recall(rig: Rig) -> None:
    _memory(rig, A)
    assert _chat(rig, A, "what is the vault code word for ticket T-88?").status_code == 200
    assert "PELICAN-77" in rig.prompts()[-1]  # the owner's turn recalls it
    assert _chat(rig, B, "what is the vault code word for ticket T-88?").status_code == 200
    assert "PELICAN-77" not in rig.prompts()[-1]


@probe("GET", "/v1/sessions/{session_id}")
def _get_session(rig: Rig) -> None:
    assert _chat(rig, A, SECRET, "s1").status_code == 200
    assert rig.client.get("/v1/sessions/s1", params={"user": "u1"}, headers=headers(A)).status_code == 200
    status, _ = _same_as_fresh(rig, "GET", "/v1/sessions/{}", "s1", "s2", params={"user": "u1"})
    assert status == 404


@probe("POST", "/v1/sessions/{session_id}/summary")
def _refresh_summary(rig: Rig) -> None:
    assert _chat(rig, A, SECRET, "s1").status_code == 200
    status, _ = _same_as_fresh(rig, "POST", "/v1/sessions/{}/summary", "s1", "s2", params={"user": "u1"})
    assert status == 404
    assert rig.client.get("/v1/sessions/s1", params={"user": "u1"}, headers=headers(A)).json()["message_count"] == 2


def _traced_turn(rig: Rig, tenant: str, session_id: str = "s1") -> str:
    """The id of ``tenant``'s chat turn once its trace is stored (written off the request path)."""
    r = _chat(rig, tenant, SECRET, session_id)
    assert r.status_code == 200, r.text
    turn_id = r.json()["recallserve"]["request_id"]
    deadline = time.monotonic() + 30
    while rig.client.get(f"/v1/turns/{turn_id}", headers=headers(tenant)).status_code != 200:
        assert time.monotonic() < deadline, "the turn's trace was not stored"
        time.sleep(0.05)
    return turn_id


@probe("GET", "/v1/turns")
def _list_turns(rig: Rig) -> None:
    mine = _traced_turn(rig, A)
    assert mine in rig.client.get("/v1/turns", headers=headers(A)).text
    r = rig.client.get("/v1/turns", headers=headers(B))
    assert r.status_code == 200 and r.json()["data"] == [], r.text
    status, body = _same_as_fresh(rig, "GET", "/v1/turns?session_id={}", "s1", "s2")
    assert status == 200 and body["data"] == []


@probe("GET", "/v1/turns/sessions")
def _turn_sessions(rig: Rig) -> None:
    _traced_turn(rig, A)
    assert "s1" in rig.client.get("/v1/turns/sessions", headers=headers(A)).text
    r = rig.client.get("/v1/turns/sessions", headers=headers(B))
    assert r.status_code == 200 and r.json()["data"] == [], r.text


@probe("GET", "/v1/turns/{turn_id}")
def _get_turn(rig: Rig) -> None:
    mine = _traced_turn(rig, A)
    assert "PELICAN" in rig.client.get(f"/v1/turns/{mine}", headers=headers(A)).text
    status, _ = _same_as_fresh(rig, "GET", "/v1/turns/{}", mine, "0" * 32)
    assert status == 404


@probe("GET", "/v1/console/me")
def _console_me(rig: Rig) -> None:
    assert rig.client.get("/v1/console/me", headers=headers(A)).json()["tenant"] == A
    assert rig.client.get("/v1/console/me", headers=headers(B)).json()["tenant"] == B


@probe("GET", "/v1/console/health")
def _console_health(rig: Rig) -> None:
    # NOTE: each tenant's own figures (test_console_health_tenancy.py): acme's write shows in acme's count and
    # changes nothing globex reads (the request counters are the process's, so compared before/after).
    before = rig.client.get("/v1/console/health", headers=headers(B)).json()
    mine = rig.client.get("/v1/console/health", headers=headers(A)).json()["memory_records"]
    _memory(rig, A)
    assert rig.client.get("/v1/console/health", headers=headers(A)).json()["memory_records"] == mine + 1
    r = rig.client.get("/v1/console/health", headers=headers(B))
    assert r.status_code == 200 and r.json() == before, r.text
    assert "PELICAN" not in r.text and A not in r.text


def test_every_route_has_a_cross_tenant_probe(rig: Rig) -> None:
    found = routes(rig.app) - TEST_ONLY
    missing = found - PROBES.keys() - NO_TENANT_DATA
    assert not missing, f"routes without a cross-tenant check in tests/security: {sorted(missing)}"
    stale = (PROBES.keys() | NO_TENANT_DATA) - found
    assert not stale, f"checks for routes the app no longer has: {sorted(stale)}"


@pytest.mark.parametrize("route", sorted(PROBES), ids=" ".join)
def test_second_tenant_learns_nothing(rig: Rig, route: tuple[str, str]) -> None:
    PROBES[route](rig)


def test_session_squatting(rig: Rig) -> None:
    """globex opening acme's id first neither locks acme out nor shows acme globex's turns."""
    assert _chat(rig, B, "globex squats: my code is KITE-42", "s1").status_code == 200
    r = _chat(rig, A, "hello", "s1")
    assert r.status_code == 200, r.text
    assert "KITE-42" not in rig.prompts()[-1]
    mine = rig.client.get("/v1/sessions/s1", params={"user": "u1"}, headers=headers(A)).json()
    assert mine["message_count"] == 2
