"""The WordLlama embedder option: the deployments' embedder and shard bodies serve it through HTTP; its files are checked."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from pydantic import ValidationError

from recallserve.deployments.config import EmbedderConfig, MemoryConfig
from recallserve.deployments.memory import EmbedderDeployment, MemoryShardDeployment, memory_backend
from recallserve.memory_shards import static_embedder
from recallserve.memory_shards.embedders import build_embedder, embedder_identity, resolve_runtime
from recallserve.memory_shards.static_embedder import WORDLLAMA_MODEL_ID, WordLlamaEmbedder

from .conftest import auth, make_app

MODEL = "wordllama-l2-supercat-256"
DOCS = [
    ("ticket-4411", "Ticket 4411: the X100 coffee machine leaked water; fixed by replacing the boiler gasket."),
    ("ticket-4412", "Ticket 4412: the X100 grinder jammed on oily beans; cleared the burr and advised a lighter roast."),
    ("trip", "We went trekking along a mountain trail in the Alps last August."),
] + [(f"note-{i}", f"Delivery note {i}: parcel {1000 + i} handed to courier DPD on day {i}.") for i in range(20)]


def test_the_config_takes_the_static_embedder_on_auto_and_refuses_another_runtime() -> None:
    assert resolve_runtime(MODEL, "cpu", "auto") == "static"
    assert embedder_identity(MODEL) == (WORDLLAMA_MODEL_ID, 256)
    assert EmbedderConfig(model=MODEL).runtime == "auto"
    with pytest.raises(ValidationError, match="runs on static, not 'onnx'"):
        EmbedderConfig(model=MODEL, runtime="onnx")
    assert isinstance(build_embedder(MODEL, runtime="auto"), WordLlamaEmbedder)  # weights load on first use only


def test_a_weights_file_that_is_not_the_pinned_one_is_refused(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("wordllama")
    files = dict(static_embedder.WORDLLAMA_FILES)
    files["weights/l2_supercat_256.safetensors"] = "0" * 64
    monkeypatch.setattr(static_embedder, "WORDLLAMA_FILES", files)
    with pytest.raises(ValueError, match="sha256 mismatch"):
        WordLlamaEmbedder().embed(["hello"])


class _Handle:
    """A deployment handle in process (no Ray): ``handle.method.remote(*args)`` awaits the body's method."""

    def __init__(self, body: Any) -> None:
        self.body = body

    def __getattr__(self, method: str) -> Any:
        async def call(*args: Any) -> Any:
            return await getattr(self.body, method)(*args)

        return type("_Method", (), {"remote": staticmethod(call)})()


@pytest.fixture(scope="module")
def wordllama_service(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    pytest.importorskip("wordllama")
    root = tmp_path_factory.mktemp("memory")
    cfg = EmbedderConfig(model=MODEL)
    embedder = _Handle(EmbedderDeployment(cfg.model_dump(mode="json")))
    shards = [_Handle(MemoryShardDeployment(i, str(root), WORDLLAMA_MODEL_ID, 256)) for i in range(2)]
    yield memory_backend([{"embedder": embedder, "shards": shards}], MemoryConfig(num_shards=2, data_dir=root), embedder=cfg)
    for s in shards:
        s.body._shard.close()


@pytest.mark.slow
def test_memories_embedded_by_wordllama_are_found_through_http(wordllama_service) -> None:
    body = {"memories": [{"text": t, "source_id": s, "kind": "text"} for s, t in DOCS]}
    with TestClient(make_app(wordllama_service)) as c:
        r = c.post("/v1/memories", headers=auth("sk-acme"), json=body)
        assert r.status_code == 200, r.text
        leak = c.post("/v1/memories/search", headers=auth("sk-acme"), json={"query": "my X100 leaks water, how was it fixed?", "k": 3})
        # Dense only (no BM25): "hiking" and "trekking" meet through the static vectors alone.
        hike = c.post("/v1/memories/search", headers=auth("sk-acme"),
                      json={"query": "hiking in the mountains", "k": 3, "hybrid": False})
    assert leak.status_code == 200 and hike.status_code == 200, (leak.text, hike.text)
    assert leak.json()["data"][0]["source_id"] == "ticket-4411"
    assert hike.json()["data"][0]["source_id"] == "trip"
    assert hike.json()["data"][0]["similarity"] > 0.3
