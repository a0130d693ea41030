"""``recallserve bench memory``: naive vs vectorised vs fused retrieval on the same data.

Three pipelines answer the same 64 queries (top-k, cosine threshold, hyperbolic decay, tenant /
expiry masks, dedup by source id) over the same synthetic shard (:mod:`._bench_data`):

* ``naive``: FAISS ``IndexFlatIP`` search of ``k * 3`` neighbours, then masks, threshold, decay
  and dedup in Python loops (the usual retrieve-then-filter code).
* ``faiss+numpy``: the same ``k * 3`` candidates, post-processed with vectorised numpy.
* ``fused``: the shard's exact scan (:func:`memory_shards._scan.fused_scan`, i.e.
  ``kernels.fused_topk``) over every row.

Exactness is the recall of the exact decayed, deduplicated top-k, computed by an independent
chunked numpy full scan (the ``faiss+numpy`` post-processing applied to every row). Oversampling
by 3 loses results whenever masks remove more than 2/3 of the nearest rows.
"""

from __future__ import annotations

import os
import platform
import socket
import statistics
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from kernels import ScoreParams

from ._bench_data import BenchData, make_bench_data
from ._scan import SECONDS_PER_DAY, fused_scan

__all__ = ["run_memory_bench", "naive_pipeline", "numpy_pipeline", "fused_pipeline", "exact_topk", "recall_at_k"]

OVERSAMPLE = 3
_TRUTH_CHUNK = 65_536


def _days(data: BenchData) -> np.ndarray:
    return (np.maximum(data.now - data.last_access, 0.0) / SECONDS_PER_DAY).astype(np.float32)


def naive_pipeline(index: Any, data: BenchData, k: int, params: ScoreParams) -> list[list[int]]:
    """FAISS top ``3k`` then Python loops: masks, threshold, decay, dedup, sort."""
    sims, ids = index.search(data.queries, k * OVERSAMPLE)
    out = []
    for qi in range(ids.shape[0]):
        best: dict[int, tuple[float, int]] = {}
        qt = int(data.query_tenant[qi])
        for sim, row in zip(sims[qi].tolist(), ids[qi].tolist()):
            if row < 0 or not data.valid[row]:
                continue
            if int(data.tenant[row]) not in (qt, 0) or data.expires[row] <= data.now or sim < params.threshold:
                continue
            days = max(data.now - float(data.last_access[row]), 0.0) / SECONDS_PER_DAY
            score = sim / (1.0 + params.decay_lambda * days)
            src = int(data.source[row])
            old = best.get(src)
            if old is None or score > old[0] or (score == old[0] and row < old[1]):
                best[src] = (score, row)
        ranked = sorted(best.values(), key=lambda x: (-x[0], x[1]))[:k]
        out.append([row for _, row in ranked])
    return out


def _postprocess(qi_rows: np.ndarray, sims: np.ndarray, data: BenchData, qt: int, k: int, params: ScoreParams, days: np.ndarray) -> list[int]:
    """Vectorised masks + decay + dedup + top-k for one query's candidate rows."""
    ok = (
        (sims >= params.threshold)
        & data.valid[qi_rows]
        & ((data.tenant[qi_rows] == qt) | (data.tenant[qi_rows] == 0))
        & (data.expires[qi_rows] > data.now)
    )
    rows, sims = qi_rows[ok], sims[ok]
    if rows.size == 0:
        return []
    scores = (sims / (np.float32(1.0) + np.float32(params.decay_lambda) * days[rows])).astype(np.float32)
    order = np.lexsort((rows, -scores))  # score desc, then lower row
    rows = rows[order]
    _, first = np.unique(data.source[rows], return_index=True)
    keep = np.sort(first)[:k]  # first occurrence per source, in rank order
    return rows[keep].tolist()


def numpy_pipeline(index: Any, data: BenchData, k: int, params: ScoreParams, days: np.ndarray) -> list[list[int]]:
    """FAISS top ``3k`` then vectorised numpy post-processing."""
    sims, ids = index.search(data.queries, k * OVERSAMPLE)
    out = []
    for qi in range(ids.shape[0]):
        sel = ids[qi] >= 0
        out.append(_postprocess(ids[qi][sel], sims[qi][sel], data, int(data.query_tenant[qi]), k, params, days))
    return out


def fused_pipeline(data: BenchData, k: int, params: ScoreParams, backend: str = "torch") -> list[list[int]]:
    """The shard's exact fused scan over every row."""
    res = fused_scan(
        data.queries, data.query_tenant, data.vectors, data.tenant, data.source,
        data.last_access, data.expires, data.valid, data.now, k, params, backend=backend,
    )
    idx = res.indices.numpy()
    return [[int(r) for r in row if r >= 0] for row in idx]


def exact_topk(data: BenchData, k: int, params: ScoreParams, days: np.ndarray) -> list[list[int]]:
    """Ground truth: every row scored (chunked numpy matmul), then the numpy post-processing."""
    cand_rows: list[list[np.ndarray]] = [[] for _ in range(data.queries.shape[0])]
    cand_sims: list[list[np.ndarray]] = [[] for _ in range(data.queries.shape[0])]
    for start in range(0, data.n, _TRUTH_CHUNK):
        block = data.queries @ data.vectors[start : start + _TRUTH_CHUNK].T
        # NOTE: only rows over the threshold can be results; keeping them makes the truth sparse.
        qi, col = np.nonzero(block >= params.threshold)
        for q in np.unique(qi):
            sel = qi == q
            cand_rows[q].append(col[sel] + start)
            cand_sims[q].append(block[q, col[sel]])
    out = []
    for q in range(data.queries.shape[0]):
        rows = np.concatenate(cand_rows[q]) if cand_rows[q] else np.zeros(0, dtype=np.int64)
        sims = np.concatenate(cand_sims[q]) if cand_sims[q] else np.zeros(0, dtype=np.float32)
        out.append(_postprocess(rows, sims, data, int(data.query_tenant[q]), k, params, days))
    return out


def recall_at_k(got: list[list[int]], truth: list[list[int]]) -> float:
    """Mean over queries of |got & truth| / |truth| (a query with an empty truth counts 1)."""
    vals = [len(set(g) & set(t)) / len(t) if t else 1.0 for g, t in zip(got, truth)]
    return float(np.mean(vals)) if vals else 1.0


def _timed(fn: Callable[[], list[list[int]]], repeats: int) -> tuple[list[list[int]], list[float]]:
    times, result = [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        result = fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return result, times


def _environment() -> dict[str, Any]:
    import faiss
    import torch

    return {
        "machine": {
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(),
        },
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "faiss": faiss.__version__,
        },
    }


def run_memory_bench(
    sizes: list[int],
    dim: int = 384,
    n_queries: int = 64,
    k: int = 20,
    repeats: int = 3,
    seed: int = 0,
    backend: str = "torch",
    progress: Callable[[str, float | None], None] | None = None,
) -> list[dict[str, Any]]:
    """Run the three pipelines at each size; one JSON-ready row per (size, method).

    Args:
        sizes: row counts to test.
        dim: vector dimension.
        n_queries: queries per batch.
        k: results per query.
        repeats: timed runs per method, methods alternating (median and min reported; one
            untimed warm-up each first).
        seed: data seed.
        backend: fused kernel backend.
        progress: ``progress(message, fraction or None)`` callback for a progress display.

    Returns:
        Rows with ``size, method, ms_per_batch, ms_runs, speedup_vs_naive, recall, ...``.
    """
    import faiss

    note = progress or (lambda msg, frac: None)
    env = _environment()
    params = ScoreParams(decay="hyperbolic", decay_lambda=0.1, combine="product", threshold=0.35)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows: list[dict[str, Any]] = []
    for n in sizes:
        note(f"{n:,} rows: generating data", 0.0)
        data = make_bench_data(n, dim, n_queries, seed, progress=lambda done, n=n: note(f"{n:,} rows: generating data", done / n))
        days = _days(data)
        note(f"{n:,} rows: building IndexFlatIP", None)
        index = faiss.IndexFlatIP(dim)
        index.add(data.vectors)
        note(f"{n:,} rows: exact ground truth", None)
        truth = exact_topk(data, k, params, days)
        methods: dict[str, Callable[[], list[list[int]]]] = {
            "naive": lambda: naive_pipeline(index, data, k, params),
            "faiss+numpy": lambda: numpy_pipeline(index, data, k, params, days),
            "fused": lambda: fused_pipeline(data, k, params, backend),
        }
        results: dict[str, tuple[list[list[int]], list[float]]] = {}
        for name, fn in methods.items():
            note(f"{n:,} rows: warm-up {name}", None)
            results[name] = (fn(), [])  # NOTE: warm-up (allocations, thread pools) not timed.
        # NOTE: methods alternate inside each repeat so a change of machine load (shared CPUs)
        # hits all of them alike instead of biasing whichever ran during the spike.
        for rep in range(repeats):
            for name, fn in methods.items():
                note(f"{n:,} rows: {name} run {rep + 1}/{repeats}", (rep + 0.5) / repeats)
                got, times = _timed(fn, 1)
                results[name] = (got, results[name][1] + times)
        base = statistics.median(results["naive"][1])
        base_min = min(results["naive"][1])
        mean_truth = float(np.mean([len(t) for t in truth]))
        for name, (got, times) in results.items():
            med = statistics.median(times)
            rows.append({
                **env,
                "timestamp": stamp,
                "size": n,
                "dim": dim,
                "queries": n_queries,
                "k": k,
                "params": params.model_dump(),
                "backend": backend if name == "fused" else "faiss",
                "method": name,
                "ms_per_batch": round(med, 3),
                "ms_runs": [round(t, 3) for t in times],
                "speedup_vs_naive": round(base / med, 3),
                "ms_min": round(min(times), 3),
                "speedup_vs_naive_min": round(base_min / min(times), 3),
                "recall": round(recall_at_k(got, truth), 4),
                "mean_results": round(float(np.mean([len(g) for g in got])), 2),
                "mean_truth_results": round(mean_truth, 2),
                "visible_share": round(float(np.mean(data.expires > data.now)), 3),
            })
        del index, data
    return rows
