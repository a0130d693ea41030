"""Diversified search through HTTP: one day's memories do not fill the whole answer."""

from __future__ import annotations

from fastapi.testclient import TestClient

from recallserve.serve.memory_api import MemoryService

from .conftest import auth, search_ids

A = auth("sk-acme")
DAY = 86_400


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
    assert set(search_ids(client, query, 3)) <= set(ids[:4])
    service.retriever.params = service.retriever.params.model_copy(update={"group_cap": 2})
    got = search_ids(client, query, 3)
    assert got[2] == ids[4] and set(got[:2]) <= set(ids[:4])
    # NOTE: pushed down, not dropped: a longer answer still holds every Monday memory.
    assert set(search_ids(client, query, 5)) == set(ids)

