"""Diversified search through HTTP: one day's memories do not fill the whole answer."""

from __future__ import annotations

from fastapi.testclient import TestClient

from serve.memory_api import MemoryService

from .conftest import auth

A = auth("sk-acme")
DAY = 86_400


def _ids(client: TestClient, query: str, k: int) -> list[str]:
    body = {"query": query, "k": k, "decay": {"decay": "none"}, "threshold": 0.0}
    r = client.post("/v1/memories/search", json=body, headers=A)
    assert r.status_code == 200, r.text
    return [hit["id"] for hit in r.json()["data"]]


def test_a_search_answer_holds_another_days_memory_with_a_group_cap(client: TestClient, service: MemoryService) -> None:
    monday = [{"text": f"Melanie took the kids to a pottery class and painted, part {i}", "created_at": 1_700_000_000 + i}
              for i in range(4)]
    friday = {"text": "Melanie went camping with the kids", "created_at": 1_700_000_000 + 4 * DAY}
    r = client.post("/v1/memories", json={"memories": [*monday, friday]}, headers=A)
    assert r.status_code == 200, r.text
    ids = r.json()["ids"]
    query = "What does Melanie do with the kids, a pottery class or painting?"
    # NOTE: Monday's four memories share more words with the question, so they fill a top-3.
    service.retriever.params = service.retriever.params.model_copy(update={"group_cap": 0, "group_decay": 1.0})
    assert set(_ids(client, query, 3)) <= set(ids[:4])
    service.retriever.params = service.retriever.params.model_copy(update={"group_cap": 2})
    got = _ids(client, query, 3)
    assert got[2] == ids[4] and set(got[:2]) <= set(ids[:4])
    # NOTE: pushed down, not dropped: a longer answer still holds every Monday memory.
    assert set(_ids(client, query, 5)) == set(ids)


def test_a_question_naming_a_speaker_finds_what_that_speaker_said(client: TestClient, service: MemoryService) -> None:
    said = [("Caroline", "Melanie, do you still go camping with the kids at the lake?"),
            ("Caroline", "Camping at the lake sounds lovely, Melanie, the kids must enjoy it"),
            ("Melanie", "We went to the beach last weekend and roasted marshmallows")]
    r = client.post("/v1/memories", json={"memories": [{"text": t, "metadata": {"speaker": who}} for who, t in said]},
                    headers=A)
    assert r.status_code == 200, r.text
    ids = r.json()["ids"]
    query = "Where has Melanie gone camping with the kids?"
    # NOTE: Caroline's questions share every word with it; only Melanie's own turn tells the answer.
    service.retriever.params = service.retriever.params.model_copy(update={"name_boost": 0.0})
    assert _ids(client, query, 3)[0] != ids[2]
    service.retriever.params = service.retriever.params.model_copy(update={"name_boost": 2.0})
    assert _ids(client, query, 3)[0] == ids[2]
