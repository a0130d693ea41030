"""A question that names a speaker finds, through HTTP and with the default retrieval, what that speaker said."""

from __future__ import annotations

from fastapi.testclient import TestClient

from recallserve.serve.memory_api import MemoryService

from .conftest import auth, search_ids

A = auth("sk-acme")


def test_a_question_naming_a_speaker_finds_what_that_speaker_said(client: TestClient, service: MemoryService) -> None:
    said = [("Caroline", "Melanie, do you still go camping with the kids at the lake?"),
            ("Caroline", "Camping at the lake sounds lovely, Melanie, the kids must enjoy it"),
            ("Melanie", "We went camping at the beach last weekend and roasted marshmallows")]
    r = client.post("/v1/memories", json={"memories": [{"text": t, "metadata": {"speaker": who}} for who, t in said]},
                    headers=A)
    assert r.status_code == 200, r.text
    ids = r.json()["ids"]
    query = "Where has Melanie gone camping with the kids?"
    # NOTE: Caroline's questions share every word with it; only Melanie's own turn tells the answer,
    # and the default retrieval (name_boost 0.5) puts it first.
    assert service.retriever.params.name_boost == 0.5
    assert search_ids(client, query, 3)[0] == ids[2]
    service.retriever.params = service.retriever.params.model_copy(update={"name_boost": 0.0})
    assert search_ids(client, query, 3)[0] != ids[2]


def test_memories_without_a_speaker_rank_as_before(client: TestClient, service: MemoryService) -> None:
    r = client.post("/v1/memories", json={"memories": [{"text": "Melanie likes camping at the lake"},
                                                       {"text": "Camping gear list for the lake trip"}]}, headers=A)
    assert r.status_code == 200, r.text
    query = "Where does Melanie like camping?"
    default = search_ids(client, query, 2)
    service.retriever.params = service.retriever.params.model_copy(update={"name_boost": 0.0})
    assert search_ids(client, query, 2) == default


def test_a_full_name_as_speaker_counts_for_its_first_name(client: TestClient, service: MemoryService) -> None:
    # NOTE: chat write-back stores the client's display name (messages[].name), often a full name.
    said = [("Caroline Lee", "Melanie, do you still go camping with the kids at the lake?"),
            ("Caroline Lee", "Camping at the lake sounds lovely, Melanie, the kids must enjoy it"),
            ("Melanie Smith", "We went camping at the beach last weekend and roasted marshmallows")]
    r = client.post("/v1/memories", json={"memories": [{"text": t, "metadata": {"speaker": who}} for who, t in said]},
                    headers=A)
    assert r.status_code == 200, r.text
    assert search_ids(client, "Where has Melanie gone camping with the kids?", 3)[0] == r.json()["ids"][2]
