"""Random memory blocks for kernel tests: clustered vectors (so many rows pass the 0.35 cosine
threshold), duplicate source ids, several tenants plus the shared one, expired and deleted rows.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

__all__ = ["NOW", "make_block", "onehot_block"]

# NOTE: a fixed epoch second (2026-01-01 00:00:50) that float32 cannot hold (spacing 128 s:
# it rounds to NOW - 50), so rows expiring at NOW - 1 catch a kernel that passes `now` as float32.
NOW = 1_767_225_650.0


def make_block(
    seed: int,
    n: int,
    d: int,
    q: int,
    *,
    n_sources: int | None = None,
    n_tenants: int = 3,
    clusters: int = 3,
    device: str = "cpu",
) -> dict[str, Any]:
    """Keyword arguments for ``fused_topk`` (all but ``k``/``params``) on random clustered data.

    Rows: unit vectors around ``clusters`` centres with a per-row noise level, so cosines spread
    across the threshold; ~10% of rows are exact copies of another row (exact score ties);
    tenants in ``0..n_tenants`` (0 = shared); ~11% expired (some exactly at ``now``, some 1 s
    before); ~8%
    invalid; ages in ``[-1, 200)`` days (negative = clock skew).
    """
    g = np.random.default_rng(seed)
    n_sources = max(1, n // 4) if n_sources is None else n_sources
    centres = g.standard_normal((clusters, d))
    centres /= np.linalg.norm(centres, axis=1, keepdims=True)

    def around(count: int) -> np.ndarray:
        c = centres[g.integers(0, clusters, count)]
        sigma = g.uniform(0.2, 2.5, (count, 1))
        x = c + sigma * g.standard_normal((count, d)) / np.sqrt(d)
        return x / np.linalg.norm(x, axis=1, keepdims=True)

    vectors = around(n).astype(np.float32)
    days = g.uniform(-1.0, 200.0, n).astype(np.float32)
    if n > 1:
        dup = g.random(n) < 0.1
        src_rows = g.integers(0, n, n)
        vectors[dup] = vectors[src_rows[dup]]
        days[dup] = days[src_rows[dup]]
    expires = np.full(n, np.inf)
    r = g.random(n)
    expires[r < 0.05] = NOW - g.uniform(1, 1e6, n)[r < 0.05]
    expires[(r >= 0.05) & (r < 0.08)] = NOW
    expires[(r >= 0.08) & (r < 0.11)] = NOW - 1.0
    expires[(r >= 0.11) & (r < 0.15)] = NOW + 1.0
    queries = (around(q) * g.uniform(0.5, 3.0, (q, 1))).astype(np.float32)  # not normalised
    return {
        "queries": torch.from_numpy(queries).to(device),
        "vectors": torch.from_numpy(vectors).to(device),
        "days_since_use": torch.from_numpy(days).to(device),
        "tenant": torch.from_numpy(g.integers(0, n_tenants + 1, n)).to(device),
        "source_id": torch.from_numpy(g.integers(0, n_sources, n) * 7 + 3).to(device),
        "expires_at": torch.from_numpy(expires).to(device),
        "query_tenant": torch.from_numpy(g.integers(1, n_tenants + 1, q)).to(device),
        "now": NOW,
        "valid": torch.from_numpy(g.random(n) >= 0.08).to(device),
    }


def onehot_block(
    seed: int, n: int, d: int, q: int, *, n_sources: int, device: str = "cpu"
) -> dict[str, Any]:
    """A block whose scores tie exactly: every row is a basis vector ``e_j`` (``j < 4``) and
    ages take 3 values, so a dot product is one query coordinate whatever the summation order.
    NOTE: ages 0/3/17 give time-factor ratios (1.3, 2.7, 2.08) unlike the coordinate ratios
    (4/3, 3/2, 2, ...), so distinct (coordinate, age) pairs never tie only in float32.
    All rows are visible (tenant 0), valid and unexpired.
    """
    g = np.random.default_rng(seed)
    vectors = np.zeros((n, d), dtype=np.float32)
    vectors[np.arange(n), g.integers(0, min(4, d), n)] = 1.0
    queries = np.zeros((q, d), dtype=np.float32)
    queries[:, : min(4, d)] = g.choice([1.0, 2.0, 3.0, 4.0], (q, min(4, d)))
    return {
        "queries": torch.from_numpy(queries).to(device),
        "vectors": torch.from_numpy(vectors).to(device),
        "days_since_use": torch.from_numpy(g.choice([0.0, 3.0, 17.0], n).astype(np.float32)).to(
            device
        ),
        "tenant": torch.zeros(n, dtype=torch.int64, device=device),
        "source_id": torch.from_numpy(g.integers(0, n_sources, n)).to(device),
        "expires_at": torch.full((n,), float("inf"), dtype=torch.float64, device=device),
        "query_tenant": torch.ones(q, dtype=torch.int64, device=device),
        "now": NOW,
        "valid": torch.ones(n, dtype=torch.bool, device=device),
    }
