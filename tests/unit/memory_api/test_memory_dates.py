"""Date-aware search through HTTP: a question that names a time finds the memory written then first."""

from __future__ import annotations

import time

from fastapi.testclient import TestClient

from recallserve.serve.memory_api import MemoryService

from .conftest import auth

A = auth("sk-acme")


def _add(client: TestClient, *memories: dict) -> list[str]:
    r = client.post("/v1/memories", json={"memories": list(memories)}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["ids"]


def _top(client: TestClient, query: str, **body) -> str:
    r = client.post("/v1/memories/search", json={"query": query, "k": 5, **body}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["data"][0]["id"]


def test_a_named_month_finds_the_memory_written_then(client: TestClient, service: MemoryService) -> None:
    march, june = _add(
        client,
        {"text": "Dinner with Anna at the harbour restaurant", "created_at": "2024-03-14T19:00:00Z"},
        {"text": "Dinner at the harbour restaurant with the team, the harbour was lovely",
         "created_at": "2025-06-10T19:00:00Z"},
    )
    query = "Where did we have dinner at the harbour in March 2024?"
    # NOTE: the June memory matches the words better and is newer (less decay): without the date
    # it wins, so the first assertion can only pass through the date-aware list.
    assert _top(client, query) == march
    service.retriever.params = service.retriever.params.model_copy(update={"date_weight": 0.0})
    assert _top(client, query) == june


def test_yesterday_is_read_against_the_time_of_the_search(client: TestClient, service: MemoryService) -> None:
    now = time.time()
    yesterday, older = _add(
        client,
        {"text": "Had a bowl of noodles at lunch", "created_at": now - 86_400},
        {"text": "What was lunch yesterday? Ramen, as always", "created_at": now - 20 * 86_400},
    )
    query = "What was lunch yesterday, ramen?"
    # NOTE: no decay and no cosine threshold, so only the words and the named day rank them; the
    # older memory shares every word of the question, the one written yesterday only "lunch".
    body = {"decay": {"decay": "none"}, "threshold": 0.0}
    assert _top(client, query, **body) == yesterday
    service.retriever.params = service.retriever.params.model_copy(update={"date_weight": 0.0})
    assert _top(client, query, **body) == older
