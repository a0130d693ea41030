"""The learned ranker re-orders the fused candidates of a search, through HTTP; its packaged file is valid."""

from __future__ import annotations

import json

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from recallserve.memory_shards.retrieval.ranker import FEATURES, PACKAGED_RANKER, RankerModel, load_ranker
from recallserve.serve.memory_api import MemoryService

from .conftest import auth

A = auth("sk-acme")


def _only(feature: str, weight: float) -> RankerModel:
    """A model that scores by one feature alone (the others weigh 0)."""
    return RankerModel(features=list(FEATURES), mean=[0.0] * len(FEATURES), scale=[1.0] * len(FEATURES),
                       coef=[weight if f == feature else 0.0 for f in FEATURES], intercept=0.0)


def _search(client: TestClient, query: str, k: int) -> list[dict]:
    body = {"query": query, "k": k, "decay": {"decay": "none"}, "threshold": 0.0}
    r = client.post("/v1/memories/search", json=body, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["data"]


def _store(client: TestClient, memories: list[dict]) -> list[str]:
    r = client.post("/v1/memories", json={"memories": memories}, headers=A)
    assert r.status_code == 200, r.text
    return r.json()["ids"]


def test_the_ranker_orders_the_answer_and_off_keeps_the_fused_order(client: TestClient, service: MemoryService) -> None:
    ids = _store(client, [{"text": "camping at the lake with the kids, camping again", "created_at": 1_000_000_000},
                          {"text": "camping trip", "created_at": 1_100_000_000},
                          {"text": "we went camping at the lake", "created_at": 1_200_000_000}])
    query = "camping at the lake"
    assert service.retriever.params.rerank_depth == 0
    fused = _search(client, query, 3)
    assert all(h["ranker_score"] is None for h in fused)
    service.retriever.params = service.retriever.params.model_copy(update={"rerank_depth": 8})
    # A model that prefers the newest memory, then one that prefers the oldest: the answer follows each.
    service.retriever.ranker = _only("recency", 1.0)
    newest = _search(client, query, 3)
    assert [h["id"] for h in newest] == [ids[2], ids[1], ids[0]]
    assert [h["ranker_score"] for h in newest] == [1.0, 0.5, 0.0]
    service.retriever.ranker = _only("recency", -1.0)
    assert [h["id"] for h in _search(client, query, 3)] == [ids[0], ids[1], ids[2]]
    # k below the depth: the first k of the re-ordered candidates, not of the fused ones.
    service.retriever.ranker = _only("recency", 1.0)
    assert [h["id"] for h in _search(client, query, 1)] == [ids[2]]


def test_the_ranker_reads_who_said_it(client: TestClient, service: MemoryService) -> None:
    ids = _store(client, [{"text": "Melanie, do you still go camping with the kids?", "metadata": {"speaker": "Caroline"}},
                          {"text": "Melanie, camping with the kids sounds lovely", "metadata": {"speaker": "Caroline"}},
                          {"text": "We went camping last weekend", "metadata": {"speaker": "Melanie"}}])
    service.retriever.params = service.retriever.params.model_copy(update={"rerank_depth": 8, "name_boost": 0.0})
    service.retriever.ranker = _only("speaker_named", 1.0)
    assert _search(client, "Where has Melanie gone camping with the kids?", 3)[0]["id"] == ids[2]
    service.retriever.ranker = _only("other_named", 1.0)
    assert _search(client, "Where has Melanie gone camping with the kids?", 3)[0]["id"] != ids[2]


def test_the_packaged_ranker_serves_a_search(client: TestClient, service: MemoryService) -> None:
    ids = _store(client, [{"text": "paper jam on tray 2"}, {"text": "the printer on floor 3 is out of toner"}])
    service.retriever.params = service.retriever.params.model_copy(update={"rerank_depth": 64})
    hits = _search(client, "paper jam tray", 2)
    assert hits[0]["id"] == ids[0]
    assert all(isinstance(h["ranker_score"], float) for h in hits)
    assert hits[0]["ranker_score"] >= hits[1]["ranker_score"]


def test_the_packaged_file_names_every_feature_and_how_it_was_trained() -> None:
    model = load_ranker()
    assert model.features == list(FEATURES)
    assert model.trained["conversations"] == ["conv-26", "conv-30", "conv-41"]
    assert str(model.trained["command"]).startswith("recallserve eval ranker ")
    assert PACKAGED_RANKER.stat().st_size < 4096


def test_a_malformed_model_is_refused_naming_the_field() -> None:
    doc = json.loads(PACKAGED_RANKER.read_text(encoding="utf-8"))
    with pytest.raises(ValidationError, match="coef"):
        RankerModel.model_validate({**doc, "coef": doc["coef"][:-1]})
    with pytest.raises(ValidationError, match="unknown"):
        RankerModel.model_validate({**doc, "features": [*doc["features"][:-1], "made_up"]})
    with pytest.raises(ValidationError, match="scale"):
        RankerModel.model_validate({**doc, "scale": [0.0] * len(doc["scale"])})
