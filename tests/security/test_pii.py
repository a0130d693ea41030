"""Personal data under the default policy (mask) on every write path, read back through the API.

Each path writes the same text (every kind the masker covers, beside the ids the agent needs) and
reads back what was stored: no raw fragment of personal data, every business id intact. The ids
are the positive control: a read-back that found nothing would fail on them.
"""

from __future__ import annotations

import time

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import IDS, IDS_TEXT, PII_TEXT, RAW, headers, wait_for_source
from tests.unit.experience._records import speed_record

TEXT = f"{PII_TEXT} {IDS_TEXT}"


def _clean(stored: str) -> None:
    assert [r for r in RAW if r in stored] == [], stored[:2000]
    assert all(i in stored for i in IDS), stored[:2000]


def _chat(rig: Rig, text: str, request_id: str, **meta: str) -> None:
    r = rig.client.post("/v1/chat/completions", headers=headers(A, **{"x-request-id": request_id}),
                        json={"model": "recallserve", "user": "u1", "metadata": {"session_id": "s1", **meta},
                              "messages": [{"role": "user", "content": text}]})
    assert r.status_code == 200, r.text


def _direct_memory(rig: Rig) -> str:
    r = rig.client.post("/v1/memories", headers=headers(A), json={"memories": [{
        "text": TEXT, "source_id": "note:1", "topic": "support/jane.doe@example.com",
        "metadata": {"email": "jane.doe@example.com", "phone": 14155550100, "note": TEXT},
        "parts": [{"name": "photo", "text": TEXT}], "ocr_text": TEXT, "image_description": TEXT}]})
    assert r.status_code == 200, r.text
    got = rig.client.get(f"/v1/memories/{r.json()['ids'][0]}", headers=headers(A)).text
    found = rig.client.post("/v1/memories/search", headers=headers(A), json={"query": TEXT, "threshold": -1}).text
    assert "14155550100" not in got + found
    return got + found


def _chat_write_back(rig: Rig) -> str:
    _chat(rig, TEXT, "req-1")
    return str(wait_for_source(rig.client, A, "chat:u1:req-1"))


def _session(rig: Rig) -> str:
    """Messages (what the next turn's prompt carries), entity table and rolling summary."""
    _chat(rig, TEXT, "req-2", context_mode="full")
    rig.engine.calls.clear()
    _chat(rig, "and what else?", "req-3", context_mode="full")
    history = rig.prompts()[-1]
    assert "104208" in history  # the first turn is in the second turn's prompt
    r = rig.client.post("/v1/sessions/s1/summary", params={"user": "u1"}, headers=headers(A))
    assert r.status_code == 200 and r.json()["refreshed"], r.text
    session = rig.client.get("/v1/sessions/s1", params={"user": "u1"}, headers=headers(A)).json()
    assert session["summary"]["text"] and session["entities"], session
    return history + str(session)


def _experience(rig: Rig) -> str:
    body = speed_record(text=TEXT, exp_id="exp-1")
    body["context"]["constraints"] = [TEXT]
    body["reasoning"][0]["evidence"] = TEXT
    body["outcome"]["answer"] = f"80 km/h; {TEXT}"
    body["evaluation"] = {"error_tags": ["units"], "review_note": TEXT}
    r = rig.client.post("/v1/experiences", headers=headers(A), json=body)
    assert r.status_code == 201, r.text
    label = rig.client.post("/v1/experiences/exp-1/label", headers=headers(A), json={"label": "wrong", "note": TEXT})
    assert label.status_code == 200, label.text
    record = rig.client.get("/v1/experiences/exp-1", headers=headers(A)).text
    segments = wait_for_source(rig.client, A, "experience:exp-1:context")
    return record + label.text + str(segments)


def _turn_trace(rig: Rig) -> str:
    """The turn's trace as the console reads it: the list line, the whole trace (question, the
    prompt the model received, memories, context) and the session's line."""
    _chat(rig, TEXT, "req-4")
    deadline = time.monotonic() + 30
    while (trace := rig.client.get("/v1/turns/req-4", headers=headers(A))).status_code != 200:
        assert time.monotonic() < deadline, "the turn's trace was not stored"
        time.sleep(0.05)
    assert "104208" in trace.json()["prompt"][-1]["content"], trace.text[:500]  # the prompt is there, masked
    listed = rig.client.get("/v1/turns", headers=headers(A)).text
    return trace.text + listed + rig.client.get("/v1/turns/sessions", headers=headers(A)).text


WRITE_PATHS = {"direct memory write": _direct_memory, "chat write-back": _chat_write_back,
               "session messages, entities, summary": _session, "experience record, label, its memories": _experience,
               "turn trace (console)": _turn_trace}


@pytest.mark.parametrize("path", WRITE_PATHS)
def test_personal_data_masked_on_every_write_path(rig: Rig, path: str) -> None:
    _clean(WRITE_PATHS[path](rig))
