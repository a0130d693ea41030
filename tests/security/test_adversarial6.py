"""A sixth adversarial pass over the memory, experience, session/turn-trace and console APIs.

* ``GET /v1/console/health`` showed every tenant the whole process's figures: all tenants' request
  counts by status, latency, experience cache lookups and verification items, and the memory
  records of every shard. Polling it, a tenant watched another's traffic and errors and counted its
  memory writes one by one. Each tenant now sees only its own figures (its requests, its memories
  without the shared collection); the per-tenant counters are kept off the keyless ``/metrics``;
  a memory outage names only its kind;
* a path id whose %-escapes are not UTF-8 (``/v1/memories/%FF``, ``/v1/sessions/%FF``) was decoded
  as U+FFFD and looked up: a 404 about an id nobody sent, where the same escape in a query is a
  400 naming it;
* a body sent to a route that reads none was dropped behind a 2xx: ``POST
  /v1/sessions/{id}/summary`` with ``{"text": ...}`` answered "refreshed", ``DELETE`` with a body
  of ids deleted the path's id only;
* an experience id holding personal data (a card, phone, SSN or IBAN; the id pattern lets digits
  and dashes through) was stored as sent, in the clear on disk, while the same record's texts and
  its memory-tier copies were masked;
* Starlette's own 404 and 405 (a path no route matches, ``/console/a%2Fb``; a method a console
  route does not take) and the ``/v1`` catch-all's 404 and the console's missing file came back as
  "Not Found" / "Method Not Allowed" / "unknown route ..." with ``param: null``;
* a card number right after a dash (``s-4111111111111111``, ``card-4111111111111111``) was not
  personal data to the masker: such a session id was stored in the clear in the session store, the
  turn traces and the memory WAL, as was such a text in a memory;
* an experience search wrote back the whole record it had read (to store its retrieval score): a
  label stored between that read and the write was undone in the record (no label, note or
  reviewer) while the row stayed filed in the label's tier;
* ~0.26 % of the server's own experience ids, and of its request ids, held a digit run the masker
  takes for a card or phone number: the memory tier's ``experience_id`` of such a record read
  ``exp_f282b[CARD_NUMBER]`` (the link to the record lost), and such a turn was listed under a
  masked key instead of its ``x-request-id``. Generated ids are letters only now.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from recallserve.serve.api.observe import new_request_id
from recallserve.serve.experience import ExperienceStore
from recallserve.serve.experience._schema import ExperienceRecord, new_experience_id
from recallserve.serve.pii import pii_kinds
from tests.security.conftest import A, B, Rig, serving
from tests.unit.edge.conftest import headers
from tests.unit.experience._records import speed_record


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


def _health(rig: Rig, tenant: str) -> dict[str, Any]:
    r = rig.client.get("/v1/console/health", headers=headers(tenant))
    assert r.status_code == 200, r.text
    return r.json()


def _experience(exp_id: str | None = None) -> dict[str, Any]:
    rec = speed_record(timestamp=1.7e9)
    if exp_id is not None:
        rec["metadata"]["id"] = exp_id
    return rec


def _chat(rig: Rig, session_id: str, text: str = "hello", tenant: str = A, **extra: str) -> Any:
    body = {"model": "recallserve", "user": "u1", "metadata": {"session_id": session_id, "agent": "off"},
            "messages": [{"role": "user", "content": text}]}
    return rig.client.post("/v1/chat/completions", json=body, headers=headers(tenant, **extra))


# ---- the console's Health page shows a tenant its own figures ----------------------------------------

def test_another_tenants_activity_changes_nothing_on_my_health_page(rig: Rig) -> None:
    before = _health(rig, B)
    mine = _health(rig, A)
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "PELICAN one"}, {"text": "PELICAN two"}]}).status_code == 200
    assert _json(rig, "GET", "/v1/memories/" + "0" * 32).status_code == 404
    assert _health(rig, A)["memory_records"] == mine["memory_records"] + 2
    # NOTE: an experience also writes its segments to the memory tier (more of acme's memories).
    assert _json(rig, "POST", "/v1/experiences", _experience("exp-health-1")).status_code == 201
    assert _json(rig, "POST", "/v1/experiences/search", {"query": "speed", "source_model": "m"}).status_code == 200

    after = _health(rig, A)
    assert after["memory_records"] > mine["memory_records"] + 2, after
    assert after["requests"] >= mine["requests"] + 4, after
    assert after["requests_by_class"]["4xx"] == mine["requests_by_class"].get("4xx", 0) + 1, after
    assert after["verification_items"] > mine["verification_items"], after
    assert after["cache_lookups"] == mine["cache_lookups"] + 1, after
    # NOTE: globex sent nothing but these reads (which its figures leave out): not one figure moved.
    assert _health(rig, B) == before


def test_the_health_page_counts_only_my_memories(rig: Rig) -> None:
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "acme note"}] * 3}).status_code == 200
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "globex note"}]}, tenant=B).status_code == 200
    assert _health(rig, A)["memory_records"] == 3
    assert _health(rig, B)["memory_records"] == 1


def test_the_per_tenant_figures_stay_off_the_keyless_metrics(rig: Rig) -> None:
    assert _json(rig, "POST", "/v1/memories", {"memories": [{"text": "acme note"}]}).status_code == 200
    assert _health(rig, A)["requests"] >= 1
    text = rig.client.get("/metrics").text
    assert "recallserve_http_requests_total" in text  # the operator's figures are still there
    assert "recallserve_tenant_" not in text and f'"{A}"' not in text and f'"{B}"' not in text


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


# ---- a search's touch does not undo a label stored meanwhile -------------------------------------------

def test_a_searchs_touch_keeps_a_label_stored_after_its_read(rig: Rig, tmp_path: Path) -> None:
    # NOTE: through HTTP first (the positive path: a label, then a search, keeps the label) ...
    assert _json(rig, "POST", "/v1/experiences", _experience("exp-race")).status_code == 201
    assert _json(rig, "POST", "/v1/experiences/exp-race/label", {"label": "correct", "note": "checked"}).status_code == 200
    hits = _json(rig, "POST", "/v1/experiences/search", {"query": "car speed", "source_model": "Qwen2.5-Coder-1.5B-Instruct"})
    assert [h["experience"]["record"]["evaluation"]["review_note"] for h in hits.json()["hits"]] == ["checked"], hits.text
    # ... then the interleaving a concurrent search and label produce, on the store both routes use.
    store = ExperienceStore(tmp_path / "exp")
    rec = ExperienceRecord.model_validate(_experience("exp-race"))
    emb = np.ones(4, dtype=np.float32)

    async def interleave() -> ExperienceRecord:
        await store.put(A, rec, tier="review", family="qwen", embedding=emb, last_used_at=1.7e9)
        read = (await store.get(A, "exp-race")).record  # the search's read
        labelled = rec.model_copy(update={"evaluation": rec.evaluation.model_copy(
            update={"human_label": "correct", "review_note": "checked"})})
        await store.put(A, labelled, tier="active", family="qwen", embedding=emb, last_used_at=1.7e9)  # the label
        scored = read.model_copy(update={"evaluation": read.evaluation.model_copy(update={"retrieval_score": 0.5})})
        await store.touch(A, [("exp-race", 1.8e9, scored.model_dump_json())])  # the search's touch
        return (await store.get(A, "exp-race")).record

    try:
        got = asyncio.run(interleave())
    finally:
        store.close()
    assert got.evaluation.human_label == "correct" and got.evaluation.review_note == "checked", got.evaluation
    assert got.evaluation.retrieval_score == 0.5


# ---- every 4xx names what it is about ------------------------------------------------------------------

@pytest.mark.parametrize(("method", "url", "status", "param"), [
    ("GET", "/console/..%2f..%2fetc%2fpasswd", 404, "path"),
    ("GET", "/console/no-such-file.js", 404, "name"),
    ("POST", "/console/index.html", 405, "method"),
    ("GET", "/v1/memories/a/b", 404, "path"),
    ("GET", "/v1/no-such-route", 404, "path"),
])
def test_a_404_or_405_names_the_part_of_the_request_at_fault(rig: Rig, method: str, url: str, status: int,
                                                             param: str) -> None:
    r = _json(rig, method, url)
    assert r.status_code == status, r.text
    err = r.json()["error"]
    assert err["param"] == param and err["message"].startswith(f"{param}: "), err
    assert err["message"] not in ("Not Found", "Method Not Allowed"), err


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
    listed = rig.client.get("/v1/turns", params={"session_id": "s-ids"}, headers=headers(A)).json()["data"]
    assert [t["id"] for t in listed] == [request_id], listed
