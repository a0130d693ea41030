"""Session ids are per tenant, seen through HTTP: no squatting, no oracle.

Tenant B (globex) opening an id first must not lock tenant A (acme) out of its own id, and
every answer A gets about an id that only B uses must be byte-for-byte the answer for an id
nobody uses (status and JSON body; the request id aside). A recording engine stands in for the
model: the prompt it receives shows that nothing of B's session reaches A's turn.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextManager, SessionStore
from recallserve.serve.context import build_router as build_session_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from tests.unit.test_turn_prompt import KEYS, RecordingEngine

A, B = "sk-acme", "sk-globex"
B_SECRET = "My order number is ORD-9090909 and never call me after 6pm."


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[tuple[TestClient, RecordingEngine]]:
    engine = RecordingEngine()
    context = ContextManager(SessionStore(tmp_path / "sessions.sqlite3"))
    pipeline = ChatPipeline(engine, PipelineSettings(write_back=False), context=context)
    auth = Authenticator(KEYS)
    with TestClient(create_app(pipeline, auth, routers=[build_session_router(context, auth)])) as c:
        yield c, engine


def _chat(c: TestClient, key: str, text: str, session_id: str) -> Any:
    return c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"},
                  json={"model": "recallserve", "user": "u1", "max_tokens": 32,
                        "metadata": {"session_id": session_id, "agent": "off"},
                        "messages": [{"role": "user", "content": text}]})


def _probe(c: TestClient, key: str, session_id: str) -> list[tuple[int, Any]]:
    """What a client can learn about an id without chatting on it: both session routes."""
    auth = {"Authorization": f"Bearer {key}"}
    return [(r.status_code, r.json()) for r in (
        c.get(f"/v1/sessions/{session_id}", params={"user": "u1"}, headers=auth),
        c.post(f"/v1/sessions/{session_id}/summary", params={"user": "u1"}, headers=auth),
    )]


def test_other_tenant_creating_an_id_first_does_not_affect_mine(rig: Any) -> None:
    c, engine = rig
    assert _chat(c, B, B_SECRET, "s1").status_code == 200  # B squats on "s1" first
    engine.calls.clear()
    r = _chat(c, A, "hello, what is my order number?", "s1")
    assert r.status_code == 200, r.text
    assert r.json()["recallserve"]["context"]["session_id"] == "s1"
    prompt = "\n".join(m.content for m in engine.prompts[-1])
    assert "ORD-9090909" not in prompt and "6pm" not in prompt
    mine = c.get("/v1/sessions/s1", params={"user": "u1"}, headers={"Authorization": f"Bearer {A}"}).json()
    theirs = c.get("/v1/sessions/s1", params={"user": "u1"}, headers={"Authorization": f"Bearer {B}"}).json()
    assert mine["message_count"] == 2 and theirs["message_count"] == 2
    assert "ORD-9090909" not in str(mine) and "ORD-9090909" in str(theirs)
    # A's second turn sees A's first turn, still nothing of B's
    engine.calls.clear()
    assert _chat(c, A, "and again?", "s1").status_code == 200
    prompt = "\n".join(m.content for m in engine.prompts[-1])
    assert "what is my order number?" in prompt and "ORD-9090909" not in prompt


def test_another_tenants_id_answers_exactly_as_a_fresh_one(rig: Any) -> None:
    c, engine = rig
    fresh = _probe(c, A, "s1")  # nobody has used "s1" yet
    assert [status for status, _ in fresh] == [404, 404]
    assert _chat(c, B, B_SECRET, "s1").status_code == 200
    assert _probe(c, A, "s1") == fresh  # B's id: the same statuses and bodies
    # the first chat turn on B's id is a fresh session's first turn: the same prompt and context
    engine.calls.clear()
    used = _chat(c, A, "hello", "s1").json()["recallserve"]["context"]
    used_prompt = engine.prompts[-1]
    engine.calls.clear()
    new = _chat(c, A, "hello", "never-used").json()["recallserve"]["context"]
    assert engine.prompts[-1] == used_prompt
    for ctx in (used, new):
        ctx.pop("latency_ms"), ctx.pop("session_id")
    assert used == new
