"""Chat write-back stores who spoke (``metadata.speaker``), and a later question naming them recalls it first.

Through HTTP on the whole ingress app (``conftest.build_app``): exchanges posted to
``/v1/chat/completions`` by two people of one tenant, each naming themselves in OpenAI's
``messages[].name``; the stored memories' metadata is read back from ``/v1/memories``, and a
later chat question about one of them shows, in its answer's ``recallserve.memories``, the
ranking the retrieval's named-speaker lists (``name_boost``) give.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from recallserve.serve.memory_api import MemoryService
from recallserve.serve.pipeline import PipelineSettings
from recallserve.serve.turn import RecallConfig

from .conftest import assert_envelope, build_app, headers, wait_for_source

# NOTE: Caroline's statements share every content word of the question below and even name
# Melanie; only Melanie's own statement tells where she went. Without the named-speaker lists
# BM25 and the hashing embedder rank Caroline's first.
# NOTE: one end user (a shared family account): a chat turn recalls only its own user's memories
# (and the tenant's unowned ones), so the two speakers are told apart by messages[].name alone.
SAID = [("fam", "Caroline", "req-c1", "Melanie and the kids love camping at the lake, I think camping there is lovely."),
        ("fam", "Caroline", "req-c2", "Camping with the kids at the lake sounds lovely for Melanie this summer."),
        ("fam", "Melanie", "req-m1", "We went camping at the beach last weekend and roasted marshmallows.")]
QUESTION = "Where has Melanie gone camping with the kids?"


@pytest.fixture
def app(tmp_path: Path) -> Iterator[tuple[TestClient, MemoryService]]:
    # NOTE: chat recall of earlier exchanges (kind "message") is off by default; this test turns it
    # on and shows the whole top-k, so the answer's memory list is the retrieval's ranking.
    settings = PipelineSettings(recall=RecallConfig(recall_exchanges=True, relative_cut=0.0))
    application, memory = build_app(tmp_path, settings=settings)
    with TestClient(application, raise_server_exceptions=False) as c:
        yield c, memory
    for shard_client in memory.coordinator.shards:
        shard_client.shard.close()


def _chat(c: TestClient, tenant: str, user: str, request_id: str, text: str, name: str | None = None):  # type: ignore[no-untyped-def]
    message = {"role": "user", "content": text, **({"name": name} if name else {})}
    return c.post("/v1/chat/completions", headers=headers(tenant, **{"x-request-id": request_id}),
                  json={"model": "recallserve", "user": user, "messages": [message]})


def _recalled(c: TestClient) -> list[str]:
    r = _chat(c, "acme", "fam", "req-q", QUESTION, "Caroline")
    assert r.status_code == 200, r.text
    return [m["source_id"] for m in r.json()["recallserve"]["memories"]]


def test_write_back_stores_the_speakers_name_and_a_question_naming_them_recalls_theirs_first(
        app: tuple[TestClient, MemoryService]) -> None:
    c, memory = app
    for user, name, request_id, text in SAID:
        assert _chat(c, "acme", user, request_id, text, name).status_code == 200
    stored = {rid: wait_for_source(c, "acme", f"chat:{user}:{rid}") for user, _, rid, _ in SAID}
    assert {rid: [m["metadata"]["speaker"] for m in got] for rid, got in stored.items()} == {
        "req-c1": ["Caroline"], "req-c2": ["Caroline"], "req-m1": ["Melanie"]}
    assert stored["req-m1"][0]["metadata"]["user"] == "fam" and stored["req-m1"][0]["user"] == "fam"

    assert memory.retriever.params.name_boost == 0.5
    assert _recalled(c)[0] == "chat:fam:req-m1"
    memory.retriever.params = memory.retriever.params.model_copy(update={"name_boost": 0.0})
    assert _recalled(c)[0] != "chat:fam:req-m1"


def test_without_a_name_the_speaker_is_the_role_and_an_earlier_name_of_the_request_counts(
        app: tuple[TestClient, MemoryService]) -> None:
    c, _ = app
    assert _chat(c, "acme", "u1", "req-1", SAID[2][3]).status_code == 200
    assert wait_for_source(c, "acme", "chat:u1:req-1")[0]["metadata"]["speaker"] == "user"
    r = c.post("/v1/chat/completions", headers=headers("acme", **{"x-request-id": "req-2"}),
               json={"model": "recallserve", "user": "u2", "messages": [
                   {"role": "user", "name": "Melanie", "content": "Hi, it is me again."},
                   {"role": "assistant", "content": "Hello!"},
                   {"role": "user", "content": SAID[2][3]}]})
    assert r.status_code == 200, r.text
    assert wait_for_source(c, "acme", "chat:u2:req-2")[0]["metadata"]["speaker"] == "Melanie"


def test_a_name_holding_personal_data_is_masked_or_refused_by_the_tenants_policy(
        app: tuple[TestClient, MemoryService]) -> None:
    c, _ = app
    assert _chat(c, "acme", "u1", "req-1", SAID[2][3], "jane.doe@example.com").status_code == 200
    assert wait_for_source(c, "acme", "chat:u1:req-1")[0]["metadata"]["speaker"] == "[EMAIL]"
    err = assert_envelope(_chat(c, "strict", "u1", "req-2", SAID[2][3], "jane.doe@example.com"), 400,
                          "messages.0.name")
    assert err["code"] == "personal_data"
    assert _chat(c, "lab", "u1", "req-3", SAID[2][3], "jane.doe@example.com").status_code == 200
    assert wait_for_source(c, "lab", "chat:u1:req-3")[0]["metadata"]["speaker"] == "jane.doe@example.com"
