"""The shard's scan hands its columns to the kernel unchanged (all rows, or a row subset)."""

from __future__ import annotations

import numpy as np
import torch

from recallserve.kernels import ScoreParams, reference_fused_topk
from recallserve.memory_shards.bench._data import make_bench_data
from recallserve.memory_shards._scan import fused_scan


def _reference(d, rows: np.ndarray, k: int, p: ScoreParams):
    days = torch.from_numpy(((d.now - d.last_access[rows]) / 86_400).astype(np.float32))
    t = lambda a: torch.from_numpy(np.ascontiguousarray(a[rows]))  # noqa: E731
    return reference_fused_topk(torch.from_numpy(d.queries), t(d.vectors), days, t(d.tenant), t(d.source), t(d.expires),
                                torch.from_numpy(d.query_tenant), d.now, k, p, valid=t(d.valid))


def test_scan_equals_reference_on_all_rows_and_on_a_subset() -> None:
    d = make_bench_data(5000, dim=24, n_queries=9, seed=2)
    d.valid[::7] = False
    p = ScoreParams(threshold=0.3, decay="exponential")
    args = (d.queries, d.query_tenant, d.columns(), d.now, 12, p)
    got = fused_scan(*args, backend="torch")
    want = _reference(d, np.arange(d.n), 12, p)
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    np.testing.assert_allclose(got.scores.numpy(), want.scores.numpy(), rtol=1e-6)
    subset = np.flatnonzero(np.arange(d.n) % 3 == 0)
    got = fused_scan(*args, backend="torch", rows=subset)
    want = _reference(d, subset, 12, p)
    np.testing.assert_array_equal(got.indices.numpy(), want.indices.numpy())
    assert (got.indices.numpy() >= 0).sum() > 20
