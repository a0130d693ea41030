"""Reciprocal rank fusion and the time factor shared with the kernel."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from recallserve.kernels import ScoreParams, fused_topk
from recallserve.memory_shards.retrieval import combined_score, rrf_fuse, time_factor


def test_rrf_formula_weights_and_ties() -> None:
    fused = dict(rrf_fuse([["a", "b", "c"], ["c", "a"]], c=60))
    assert fused["a"] == pytest.approx(1 / 61 + 1 / 62)
    assert fused["c"] == pytest.approx(1 / 63 + 1 / 61)
    assert fused["b"] == pytest.approx(1 / 62)
    assert [k for k, _ in rrf_fuse([["a", "b"], ["b", "a"]])] == ["a", "b"]  # tie -> first seen
    assert [k for k, _ in rrf_fuse([["a"], ["b"]], weights=[0.5, 1.0])] == ["b", "a"]
    with pytest.raises(ValueError, match="weights"):
        rrf_fuse([["a"]], weights=[1.0, 2.0])


@pytest.mark.parametrize("params", [
    ScoreParams(decay="none"),
    ScoreParams(decay="hyperbolic", decay_lambda=0.1),
    ScoreParams(decay="exponential", half_life_days=7.0),
    ScoreParams(decay="hyperbolic", combine="weighted", similarity_weight=0.6),
])
def test_time_factor_and_score_match_the_kernel(params: ScoreParams) -> None:
    now = 1_700_000_000.0
    days = np.array([0.0, 1.5, 30.0, 400.0], dtype=np.float32)
    rng = np.random.default_rng(0)
    vecs = rng.normal(size=(4, 8)).astype(np.float32)
    vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
    q = vecs[:1] + 0.1
    res = fused_topk(torch.from_numpy(q), torch.from_numpy(vecs), torch.from_numpy(days),
                     torch.ones(4, dtype=torch.int64), torch.arange(4, dtype=torch.int64),
                     torch.full((4,), math.inf, dtype=torch.float64), torch.ones(1, dtype=torch.int64),
                     now, 4, params.model_copy(update={"threshold": -1.0}))
    for j in range(4):
        row = int(res.indices[0, j])
        f = time_factor(params, now - float(days[row]) * 86400.0, now)
        assert f == pytest.approx(float(res.time_factor[0, j]), rel=1e-5)
        sim = float(res.similarity[0, j])
        assert combined_score(params, sim, f) == pytest.approx(float(res.scores[0, j]), rel=1e-5, abs=1e-6)
