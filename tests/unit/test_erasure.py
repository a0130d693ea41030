"""Forget on request, end to end over HTTP: unique strings planted through every write path of two
users, one of them erased; then no byte under the data, state and log folders and no read API holds
the erased user's strings, before and after a restart, and every string of the other user is kept.

Write paths (docs/erasure.md lists them with the copies each makes): the memory API (text, long
text in chunks, image description, OCR text, parts), a chat turn with a session (messages, entity
table, rolling summary, exchange write-back, turn trace with the rendered prompt), segmented
reasoning (experience record and its memory segments), and the experience API.
"""

from __future__ import annotations

import asyncio
import json
import logging
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient

from recallserve.deployments.engines import LlamaCppConfig, LlamaCppEngine
from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.context import ContextConfig, ContextManager, LLMSummariser, SessionStore
from recallserve.serve.context import build_router as build_session_router
from recallserve.serve.erasure import ErasureLog, ErasureService
from recallserve.serve.erasure import build_router as build_erasure_router
from recallserve.serve.experience import ExperienceConfig, ExperienceService
from recallserve.serve.experience import build_router as build_experience_router
from recallserve.serve.memory_api import MemoryService
from recallserve.serve.memory_api import build_router as build_memory_router
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings
from recallserve.serve.traces import TraceRecorder, TraceStore
from recallserve.serve.traces import build_router as build_turn_router

from .experience._records import speed_record

pytestmark = pytest.mark.slow

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
H = {"Authorization": "Bearer sk-acme"}
USERS = {"quser-aardvark": "zebu", "quser-bison": "yak"}
"""End user -> the letters its planted strings start with (letters only: no masker rewrites them)."""


@pytest.fixture(scope="module")
def engine() -> LlamaCppEngine:
    return LlamaCppEngine(LlamaCppConfig(model="smollm2-135m-instruct-q4_1", n_ctx=2048, n_threads=1))


class Stack:
    """The ingress's parts in-process, over folders that outlive it (a restart is a new Stack)."""

    def __init__(self, root: Path, engine: LlamaCppEngine) -> None:
        self.root = root
        self.experience_ids: dict[str, list[str]] = {}
        emb = HashingEmbedder(384)

        async def embed(texts: list[str]):  # type: ignore[no-untyped-def]
            return await asyncio.to_thread(emb.embed, texts)

        self.coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=root / "data" / "memory")
        self.memory = MemoryService(self.coord, embed, top_k=16, threshold=0.0)
        state = root / "state"
        self.context = ContextManager(SessionStore(state / "sessions.sqlite3"),
                                      ContextConfig(summary_keep_recent=2, summary_max_tokens=48), embed=emb.embed,
                                      summariser=LLMSummariser(engine))
        self.experiences = ExperienceService(ExperienceConfig(data_dir=state / "experiences", max_tokens=64), emb.embed,
                                             memory=self.memory)
        self.traces = TraceRecorder(TraceStore(state / "turns.sqlite3"))
        self.erasure = ErasureService(ErasureLog(state / "erasures.sqlite3"), self.memory.coordinators(), {
            "sessions": self.context.store, "experiences": self.experiences.store, "turns": self.traces.store})
        self.pipeline = ChatPipeline(engine, PipelineSettings(max_request_tokens=48), memory=self.memory,
                                     context=self.context, experiences=self.experiences, traces=self.traces)
        auth = Authenticator(KEYS)
        routers = [build_memory_router(self.memory, auth), build_session_router(self.context, auth),
                   build_experience_router(self.experiences, auth), build_turn_router(self.traces.store, auth),
                   build_erasure_router(self.erasure, auth)]
        self.client = TestClient(create_app(self.pipeline, auth, routers=routers,
                                            on_startup=[self.erasure.resume], startup_wait_s=5.0))
        self.client.__enter__()

    def close(self) -> None:
        self.client.__exit__(None, None, None)
        for shard_client in self.coord.shards:
            shard_client.shard.close()
        self.context.store.close()
        self.experiences.close()
        self.traces.store.close()
        self.erasure.erasures.close()


@pytest.fixture
def app_log(tmp_path: Path) -> Iterator[Path]:
    """Every log record of the service, at DEBUG, in a file under the log folder."""
    path = tmp_path / "logs" / "app.log"
    path.parent.mkdir(parents=True)
    handler = logging.FileHandler(path, encoding="utf-8")
    handler.setLevel(logging.DEBUG)
    # NOTE: the test's own HTTP client logs the URLs it calls (a user id in a path): not the service's log.
    handler.addFilter(lambda record: not record.name.startswith("httpx"))
    root = logging.getLogger()
    old = root.level
    root.addHandler(handler)
    root.setLevel(logging.DEBUG)
    yield path
    root.removeHandler(handler)
    root.setLevel(old)
    handler.close()


def _wait(check, what: str, timeout: float = 120.0) -> Any:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        got = check()
        if got:
            return got
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def _plant(s: Stack, user: str, tag: str) -> list[str]:
    """Write the user's unique strings through every path; returns the strings."""
    c = s.client
    strings = {k: f"{tag}{k}" for k in ("memo", "longx", "photo", "ocrx", "partx", "chatx", "segx", "expx")}
    long_text = " ".join(["filler words about the quarterly plan"] * 120) + f" {strings['longx']} end"
    r = c.post("/v1/memories", headers=H, json={"memories": [
        {"text": f"My note says {strings['memo']}", "user": user, "image_description": f"a photo of {strings['photo']}",
         "ocr_text": f"receipt {strings['ocrx']}", "parts": [{"name": "resolution", "text": f"fixed by {strings['partx']}"}]},
        {"text": long_text, "user": user, "kind": "text"}]})
    assert r.status_code == 200, r.text
    chat = c.post("/v1/chat/completions", headers=H, json={
        "model": "recallserve", "user": user, "max_tokens": 8, "metadata": {"session_id": f"sess-{tag}"},
        "messages": [{"role": "user", "content": f"I moved to Lisbon last spring with my cat {strings['chatx']}."}]})
    assert chat.status_code == 200, chat.text
    rid = chat.headers["x-request-id"]
    _wait(lambda: c.get("/v1/memories", headers=H, params={"source_id": f"chat:{user}:{rid}"}).json()["data"],
          "the chat write-back")
    _wait(lambda: c.get("/v1/turns", headers=H, params={"session_id": f"sess-{tag}"}).json()["data"],
          "the turn trace")
    seg = c.post("/v1/chat/completions", headers=H, json={
        "model": "recallserve", "user": user, "max_tokens": 48,
        "metadata": {"reasoning": "segmented", "task_domain": "arithmetic"},
        "messages": [{"role": "user", "content": f"What is 17 * 3 for the box {strings['segx']}?"}]})
    assert seg.status_code == 200, seg.text
    seg_id = seg.json()["recallserve"]["experience"]["id"]
    assert seg_id, "the segmented trace was not stored"
    record = speed_record(text=f"A car of {strings['expx']} drives 120 km in 1.5 h. What is its speed?")
    record["metadata"]["user"] = user
    r = c.post("/v1/experiences", headers=H, json=record)
    assert r.status_code == 201, r.text
    s.experience_ids[user] = [seg_id, r.json()["record"]["metadata"]["id"]]
    _wait(lambda: not s.pipeline._background, "the turns' background work", 300)
    return list(strings.values())


def _files_holding(root: Path, needle: str) -> list[str]:
    raw = needle.encode()
    return [str(p.relative_to(root)) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes()]


def _api_holding(s: Stack, user: str, needle: str) -> list[str]:
    """Read APIs whose answer contains ``needle``."""
    c = s.client
    found = []
    search = c.post("/v1/memories/search", headers=H, json={"query": needle, "k": 50}).text
    if needle in search:
        found.append("memories/search")
    if needle in c.get("/v1/turns", headers=H, params={"limit": 500}).text:
        found.append("turns")
    for turn in c.get("/v1/turns", headers=H, params={"limit": 500}).json()["data"]:
        if needle in c.get(f"/v1/turns/{turn['id']}", headers=H).text:
            found.append(f"turns/{turn['id']}")
    if needle in c.get("/v1/experiences/review", headers=H).text:
        found.append("experiences/review")
    for exp_id in s.experience_ids.get(user, []):
        got = c.get(f"/v1/experiences/{exp_id}", headers=H)
        if got.status_code != 404:
            found.append(f"experiences/{exp_id}")
    tag = USERS[user]
    if needle in c.get(f"/v1/sessions/sess-{tag}", headers=H, params={"user": user}).text:
        found.append("sessions")
    if needle in c.get(f"/v1/users/{user}/export", headers=H).text:
        found.append("export")
    return found


def test_erasing_a_user_leaves_no_byte_and_no_answer_and_keeps_the_other_user(
        tmp_path: Path, engine: LlamaCppEngine, app_log: Path) -> None:
    s = Stack(tmp_path, engine)
    planted = {user: _plant(s, user, tag) for user, tag in USERS.items()}
    gone, kept = "quser-aardvark", "quser-bison"
    for needle in planted[gone]:
        assert _files_holding(tmp_path, needle), f"{needle} was never stored"
    export = json.loads(s.client.get(f"/v1/users/{gone}/export", headers=H).text)
    assert export["memories"] and export["sessions"] and export["turns"] and len(export["experiences"]) == 2

    t0 = time.monotonic()
    r = s.client.delete(f"/v1/users/{gone}", headers=H)
    assert r.status_code == 202, r.text
    eid = r.json()["id"]
    assert s.client.delete(f"/v1/users/{gone}", headers=H).json()["id"] == eid  # idempotent while pending
    done = _wait(lambda: (g := s.client.get(f"/v1/erasures/{eid}", headers=H).json())["status"] == "done" and g,
                 "the erasure", 60)
    elapsed = time.monotonic() - t0
    assert done["counts"]["memories"] >= 4 and done["counts"]["sessions"] == 1 and done["counts"]["experiences"] == 2
    assert s.client.get(f"/v1/erasures/{eid}", headers={"Authorization": "Bearer sk-globex"}).status_code == 404

    def check(stack: Stack) -> None:
        stack.experience_ids = s.experience_ids
        for needle in [*planted[gone], gone]:
            assert _files_holding(tmp_path, needle) == [], f"{needle} still on disk"
        for needle in planted[gone]:
            assert _api_holding(stack, gone, needle) == [], f"{needle} still answered"
        for needle in planted[kept]:
            assert _files_holding(tmp_path / "data", needle) or _files_holding(tmp_path / "state", needle), needle
        kept_export = stack.client.get(f"/v1/users/{kept}/export", headers=H).text
        assert all(n in kept_export for n in planted[kept]), "another user's data was lost"

    audit = s.client.get("/v1/erasures", headers=H)
    assert audit.status_code == 200 and {r["object"] for r in audit.json()["data"]} == {"erasure", "export"}
    assert gone not in audit.text and eid in audit.text
    check(s)
    s.close()
    again = Stack(tmp_path, engine)
    try:
        check(again)
    finally:
        again.close()
    log_text = app_log.read_text(encoding="utf-8")
    assert f"erasure {eid} done" in log_text and gone not in log_text
    print(f"erasure of one user took {elapsed:.2f} s")
