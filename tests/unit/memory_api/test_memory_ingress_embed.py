"""The ingress's memory service over deployment bodies behind pickling handles: one Ray hop less per search.

Each handle here pickles the arguments and the answer with Ray's cloudpickle, as a Ray hop does,
so the shards' answers travel in their compact wire form (``recallserve.memory_shards.retrieval._wire``);
the embedder and shard bodies are the deployments' own classes (real MiniLM on ONNX Runtime).
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from ray import cloudpickle

from recallserve.deployments.config import EmbedderConfig, MemoryConfig
from recallserve.deployments.memory import EmbedderDeployment, MemoryShardDeployment, memory_backend
from recallserve.memory_shards.retrieval import ShardHybridResult
from recallserve.memory_shards.retrieval._wire import WireHit, pack_hits, unpack_hits
from recallserve.serve.memory_api import MemoryService

from .conftest import auth, make_app

DOCS = [
    ("ticket-4411", "Ticket 4411: the X100 coffee machine leaked water; fixed by replacing the boiler gasket."),
    ("ticket-4412", "Ticket 4412: the X100 grinder jammed on oily beans; cleared the burr and advised a lighter roast."),
    ("manual-x100-7", "X100 manual, section 7: descale every 200 cups with citric acid."),
] + [(f"note-{i}", f"Delivery note {i}: parcel {1000 + i} handed to courier DPD on day {i}.") for i in range(20)]


class _Handle:
    """A deployment handle in process: every call and answer goes through cloudpickle, as over Ray."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.calls: dict[str, int] = {}

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any) -> Any:
            self.calls[method] = self.calls.get(method, 0) + 1
            result = await getattr(self.body, method)(*cloudpickle.loads(cloudpickle.dumps(args)))
            return cloudpickle.loads(cloudpickle.dumps(result))

        return type("_Method", (), {"remote": staticmethod(call)})()


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[_Handle, list[_Handle], MemoryConfig, EmbedderConfig]]:
    root = tmp_path_factory.mktemp("memory")
    cfg = EmbedderConfig(runtime="onnx", bulk_min_texts=16, ingress_max_texts=4)
    memory = MemoryConfig(num_shards=2, data_dir=root)
    embedder = _Handle(EmbedderDeployment(cfg.model_dump(mode="json")))
    shards = [_Handle(MemoryShardDeployment(i, str(root))) for i in range(2)]
    yield embedder, shards, memory, cfg
    for s in shards:
        s.body._shard.close()


def _backend(cluster: tuple[_Handle, list[_Handle], MemoryConfig, EmbedderConfig], local: bool) -> MemoryService:
    embedder, shards, memory, cfg = cluster
    return memory_backend([{"embedder": embedder, "shards": shards}], memory,
                          embedder=cfg if local else cfg.model_copy(update={"ingress_max_texts": 0}))


def test_a_search_embeds_its_query_in_the_ingress_and_answers_as_through_the_embedder(cluster) -> None:
    embedder = cluster[0]
    local, remote = _backend(cluster, local=True), _backend(cluster, local=False)
    body = {"memories": [{"text": t, "source_id": s, "kind": "text"} for s, t in DOCS]}
    query = {"query": "my X100 leaks water, how was it fixed?", "k": 5}
    with TestClient(make_app(local)) as c, TestClient(make_app(remote)) as r:
        assert c.post("/v1/memories", headers=auth("sk-acme"), json=body).status_code == 200
        writes = embedder.calls["embed"]  # 23 texts: a bulk call, sent to the deployment
        near = c.post("/v1/memories/search", headers=auth("sk-acme"), json=query)
        assert near.status_code == 200, near.text
        assert embedder.calls["embed"] == writes  # the query never reached the embedder deployment
        far = r.post("/v1/memories/search", headers=auth("sk-acme"), json=query)
        assert embedder.calls["embed"] == writes + 1
    hits, same = near.json()["data"], far.json()["data"]
    assert hits[0]["source_id"] == "ticket-4411" and "gasket" in hits[0]["text"]
    # NOTE: the same model in both places, and the same fused ranking from the shards' wire answers.
    assert [(h["id"], h["score"], h["similarity"]) for h in hits] == [(h["id"], h["score"], h["similarity"]) for h in same]


def test_a_shard_answer_crosses_a_hop_as_one_blob_and_builds_only_the_records_read(cluster) -> None:
    import asyncio
    import time

    from recallserve.kernels import ScoreParams

    local = _backend(cluster, local=True)
    qvec = asyncio.run(local.embed(["X100 grinder jammed"]))[0]
    answers = [s.body._shard.hybrid_search(qvec, "X100 grinder jammed", "acme", 8, 8, ScoreParams(threshold=0.2), None,
                                           time.time()) for s in cluster[1]]
    answer = max(answers, key=lambda a: len(a.dense) + len(a.lexical))
    assert answer.dense and answer.lexical
    wire = cloudpickle.loads(cloudpickle.dumps(answer))
    assert isinstance(wire, ShardHybridResult) and wire.shared_rows == answer.shared_rows
    assert all(isinstance(h, WireHit) and h._record is None for h in wire.dense)
    assert [(h.id, h.source_id, h.score, h.similarity, h.time_factor, h.part_index, h.shard) for h in wire.dense] == \
        [(h.record.id, h.record.source_id, h.score, h.similarity, h.time_factor, h.part_index, h.shard) for h in answer.dense]
    assert [h.metadata for h in wire.dense] == [h.record.metadata for h in answer.dense]
    assert all(h._record is None for h in wire.dense)  # ids, scores and metadata are read from the tuples
    assert [(h.record, b) for h, b in wire.lexical] == [(h.record, b) for h, b in answer.lexical]
    assert wire.dense[1]._record is None  # reading one hit's record builds that record only
    # An answer packed by a version with other record fields is refused, not misread.
    fields, records, d, lx = pickle.loads(pack_hits(answer.dense, answer.lexical))
    with pytest.raises(ValueError, match="record fields"):
        unpack_hits(pickle.dumps((fields[:-1], records, d, lx)))


def test_ingress_embedding_is_for_small_cpu_calls_only() -> None:
    with pytest.raises(ValueError, match="ingress_max_texts"):
        EmbedderConfig(device="cuda", runtime="torch", ingress_max_texts=1)
    with pytest.raises(ValueError, match="bulk_min_texts"):
        EmbedderConfig(bulk_min_texts=4, ingress_max_texts=4)
    assert EmbedderConfig().ingress_max_texts == 0


class _SyncHandle:
    """A deployment handle as a worker thread uses it: ``.remote(...).result(timeout_s=...)``."""

    def __init__(self, body: Any) -> None:
        self.body = body
        self.calls = 0

    @property
    def embed(self) -> Any:
        import asyncio

        def remote(texts: list[str]) -> Any:
            self.calls += 1
            vectors = asyncio.run(self.body.embed(cloudpickle.loads(cloudpickle.dumps(texts))))
            return type("_Result", (), {"result": staticmethod(lambda timeout_s: vectors)})()

        return type("_Method", (), {"remote": staticmethod(remote)})()


def test_context_mode_and_experience_embeds_run_in_the_ingress_too(cluster) -> None:
    """The blocking embed that context-mode and experiences call from worker threads skips the hop
    for small calls (the same vectors as the deployment's) and sends larger ones to the deployment."""
    from recallserve.deployments.ingress import _sync_embed
    from recallserve.deployments.memory import LocalEmbedders

    embedder_body, _, _, cfg = cluster
    handle = _SyncHandle(embedder_body.body)
    local = LocalEmbedders()
    embed = _sync_embed(handle, local.get(cfg), cfg.ingress_max_texts)
    texts = ["keep the budget under 500 euros", "the customer prefers email"]
    near = embed(texts)
    assert handle.calls == 0 and near.shape == (2, 384) and near.dtype.name == "float32"
    import asyncio

    far = asyncio.run(embedder_body.body.embed(texts))
    assert abs(near - far).max() < 1e-5
    many = [f"turn {i} of the session" for i in range(cfg.ingress_max_texts + 1)]
    assert embed(many).shape == (len(many), 384) and handle.calls == 1
    # one copy of the weights per embedder config in a process, shared with the memory API
    assert local.get(cfg) is local.get(cfg.model_copy())
    assert local.get(cfg.model_copy(update={"ingress_max_texts": 0})) is None
    assert _sync_embed(handle)(texts).shape == (2, 384) and handle.calls == 2  # no local model: the deployment
