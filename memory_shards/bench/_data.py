"""Synthetic memory data for ``recallserve bench memory`` (clustered, with masks that matter).

Rows are unit vectors around random cluster centres::

    x = normalise(centre[c] + s * g / sqrt(D)),  g ~ N(0, I),  s ~ U(0.7, 1.6) per row
    q = normalise(centre[c_q] + 0.8 * g' / sqrt(D))

so cos(q, x) ~ 1 / (sqrt(1 + s^2) * sqrt(1 + 0.64)) in 0.29..0.55 inside the query's cluster
(the 0.35 threshold keeps most of it) and ~0 +- 0.05 outside (masked). About 100 rows per
cluster. Masks that oversampling must survive: 16 private tenants plus 20% shared rows (a query
sees ~1/4 of its cluster), 10% expired rows, 1/3 of rows continuing the previous row's record
(same source id, tenant and cluster: dedup), and days since last use ~ Exp(mean 20) (decay
reorders by age). Generated in chunks with one RNG stream per chunk, so 1M x 384 never needs
more than the output arrays plus one chunk.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from .._device import DTYPES, KernelColumns

__all__ = ["BenchData", "make_bench_data"]

# NOTE: the constants below set the share of rows each mask removes; see the module docstring.
N_TENANTS = 16
SHARED_SHARE = 0.2
EXPIRED_SHARE = 0.1
CONTINUE_SHARE = 1 / 3
ROWS_PER_CLUSTER = 100
MEAN_DAYS = 20.0
_CHUNK = 65_536


@dataclass
class BenchData:
    """Columns of one synthetic shard plus a query batch."""

    vectors: np.ndarray  # [N, D] float32, unit rows
    tenant: np.ndarray  # [N] int64, 0 = shared
    source: np.ndarray  # [N] int64 dedup key
    last_access: np.ndarray  # [N] float64 epoch s
    expires: np.ndarray  # [N] float64 epoch s, +inf never
    valid: np.ndarray  # [N] bool
    queries: np.ndarray  # [Q, D] float32, unit rows
    query_tenant: np.ndarray  # [Q] int64
    now: float

    @property
    def n(self) -> int:
        """Rows."""
        return self.vectors.shape[0]

    def columns(self, device: str = "cpu", dtype: str = "float32") -> KernelColumns:
        """The rows as kernel columns on ``device`` (as a device-resident shard holds them)."""
        return KernelColumns.from_numpy(self.vectors, self.tenant, self.source, self.last_access, self.expires,
                                        self.valid, device=device, dtype=DTYPES[dtype])


def _unit(x: np.ndarray) -> np.ndarray:
    return (x / np.linalg.norm(x, axis=1, keepdims=True)).astype(np.float32)


def make_bench_data(
    n: int,
    dim: int = 384,
    n_queries: int = 64,
    seed: int = 0,
    now: float = 1.7e9,
    progress: Callable[[int], None] | None = None,
) -> BenchData:
    """Generate ``n`` rows and ``n_queries`` queries (deterministic for a seed).

    Args:
        n: rows.
        dim: dimension.
        n_queries: queries in the batch.
        seed: RNG seed.
        now: the "current" epoch time of the benchmark.
        progress: called with the number of rows generated after each chunk.
    """
    if n < 1 or dim < 2 or n_queries < 1:
        raise ValueError(f"n, dim, n_queries: need n>=1, dim>=2, n_queries>=1, got {n}, {dim}, {n_queries}")
    root = np.random.default_rng(seed)
    n_clusters = max(8, n // ROWS_PER_CLUSTER)
    centres = _unit(root.standard_normal((n_clusters, dim), dtype=np.float32))
    vectors = np.empty((n, dim), dtype=np.float32)
    tenant = np.empty(n, dtype=np.int64)
    source = np.empty(n, dtype=np.int64)
    last_access = np.empty(n, dtype=np.float64)
    expires = np.empty(n, dtype=np.float64)
    for start in range(0, n, _CHUNK):
        end = min(n, start + _CHUNK)
        m = end - start
        rng = np.random.default_rng([seed, start])
        cluster = rng.integers(0, n_clusters, m)
        ten = np.where(rng.random(m) < SHARED_SHARE, 0, rng.integers(1, N_TENANTS + 1, m))
        src = np.arange(start, end, dtype=np.int64)
        # A continued row belongs to the previous row's record: same source, tenant and cluster.
        cont = rng.random(m) < CONTINUE_SHARE
        cont[0] = False
        for i in np.flatnonzero(cont):
            cluster[i], ten[i], src[i] = cluster[i - 1], ten[i - 1], src[i - 1]
        scale = rng.uniform(0.7, 1.6, (m, 1)).astype(np.float32)
        noise = rng.standard_normal((m, dim), dtype=np.float32) / np.float32(np.sqrt(dim))
        vectors[start:end] = _unit(centres[cluster] + scale * noise)
        tenant[start:end] = ten
        source[start:end] = src
        last_access[start:end] = now - rng.exponential(MEAN_DAYS, m) * 86_400.0
        exp = np.full(m, np.inf)
        expired = rng.random(m) < EXPIRED_SHARE
        exp[expired] = now - rng.uniform(1, 1e6, int(expired.sum()))
        exp[~expired & (rng.random(m) < 0.3)] = now + 30 * 86_400.0
        expires[start:end] = exp
        if progress is not None:
            progress(end)
    q_cluster = root.integers(0, n_clusters, n_queries)
    queries = _unit(centres[q_cluster] + 0.8 * root.standard_normal((n_queries, dim), dtype=np.float32) / np.float32(np.sqrt(dim)))
    query_tenant = root.integers(1, N_TENANTS + 1, n_queries).astype(np.int64)
    return BenchData(vectors, tenant, source, last_access, expires, np.ones(n, dtype=bool), queries, query_tenant, now)
