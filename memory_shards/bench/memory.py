"""``recallserve bench memory``: retrieve-then-filter baselines vs the fused scan on the same data.

Every pipeline answers the same 64 queries (top-k, cosine threshold, hyperbolic decay, tenant /
expiry masks, dedup by source id) over the same synthetic shard (:mod:`._data`):

* ``naive``: FAISS ``IndexFlatIP`` search of ``k * 3`` neighbours, then masks, threshold, decay
  and dedup in Python loops (the usual retrieve-then-filter code).
* ``faiss+numpy``: the same ``k * 3`` candidates, post-processed with vectorised numpy.
* ``faiss+numpy@0.99``: the same, oversampled (x1, x2, x4, ...) until recall >= 0.99.
* ``faiss-idselector@0.99``: FAISS with an ``IDSelectorBitmap`` (valid, tenant or shared, not
  expired) so masked rows never take a slot, plus numpy dedup, oversampled until recall >= 0.99.
* ``faiss-gpu+numpy@0.99`` (CUDA and faiss-gpu only): a GPU flat index, oversampled likewise
  (GPU indexes ignore ID selectors).
* ``unfused-torch``: dense ``[Q, N]`` cosine, masks and scores in torch on the fused path's
  device, then exact dedup + top-k (exact; what fusion saves).
* ``fused``: the shard's exact scan (:func:`recallserve.memory_shards._scan.fused_scan`, i.e.
  ``recallserve.kernels.fused_topk``: Triton on CUDA, torch on the CPU) over device-resident columns.

FAISS rows are left out when faiss is not installed (a bare GPU machine).

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
import torch

from recallserve.kernels import ScoreParams
from recallserve.kernels._select import select_topk_scores, time_factor
from recallserve.kernels.bench import _peak_for, scan_bytes
from recallserve.kernels.reference import masked_scores, normalize_queries

from .._device import DTYPES, KernelColumns
from .._ivf import faiss_gpu_available
from ._data import BenchData, make_bench_data
from .._scan import SECONDS_PER_DAY, fused_scan

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


def numpy_pipeline(index: Any, data: BenchData, k: int, params: ScoreParams, days: np.ndarray,
                   oversample: int = OVERSAMPLE) -> list[list[int]]:
    """FAISS top ``k * oversample`` (default 3) then vectorised numpy post-processing."""
    sims, ids = index.search(data.queries, min(data.n, k * oversample))
    out = []
    for qi in range(ids.shape[0]):
        sel = ids[qi] >= 0
        out.append(_postprocess(ids[qi][sel], sims[qi][sel], data, int(data.query_tenant[qi]), k, params, days))
    return out


def fused_pipeline(data: BenchData, k: int, params: ScoreParams, backend: str = "torch",
                   cols: KernelColumns | None = None) -> list[list[int]]:
    """The shard's exact fused scan over every row (``cols``: device-resident columns, default CPU)."""
    res = fused_scan(data.queries, data.query_tenant, data.columns() if cols is None else cols, data.now, k, params,
                     backend=backend)
    idx = res.indices.cpu().numpy()
    return [[int(r) for r in row if r >= 0] for row in idx]


def unfused_torch_pipeline(data: BenchData, cols: KernelColumns, k: int, params: ScoreParams) -> list[list[int]]:
    """Unfused torch on the columns' device: the dense ``[Q, N]`` cosine, mask and score matrices, then an exact
    dedup + top-k (``recallserve.kernels._select.select_topk_scores``): what the fused kernel saves is those passes."""
    q = normalize_queries(torch.from_numpy(data.queries).to(cols.vectors.device))
    days = ((data.now - cols.last_access).clamp_min(0.0) / SECONDS_PER_DAY).to(torch.float32)
    row_ok = cols.valid & (cols.expires > data.now)
    qt = torch.from_numpy(data.query_tenant).to(q.device)
    _, score = masked_scores(q, cols.vectors, time_factor(days, params), row_ok, cols.tenant, qt, params)
    _, rows = select_topk_scores(score, cols.source, k)
    return [[int(r) for r in row if r >= 0] for row in rows.cpu().numpy()]


def idselector_pipeline(index: Any, data: BenchData, k: int, params: ScoreParams, days: np.ndarray,
                        oversample: int) -> list[list[int]]:
    """FAISS search restricted by an ``IDSelectorBitmap`` (valid, tenant or shared, not expired) per query
    tenant, ``k * oversample`` neighbours, then threshold, decay and dedup (numpy). The filter costs one
    ``[N]`` mask per distinct tenant of the batch, as in the shard's IVF path."""
    import faiss

    out: list[list[int]] = [[] for _ in range(data.queries.shape[0])]
    live = data.valid & (data.expires > data.now)
    depth = min(data.n, k * oversample)
    for tenant in np.unique(data.query_tenant):
        sel = np.flatnonzero(data.query_tenant == tenant)
        bitmap = np.packbits(live & ((data.tenant == tenant) | (data.tenant == 0)), bitorder="little")
        params_f = faiss.SearchParameters(sel=faiss.IDSelectorBitmap(data.n, faiss.swig_ptr(bitmap)))
        sims, ids = index.search(data.queries[sel], depth, params=params_f)
        for j, qi in enumerate(sel):
            ok = ids[j] >= 0
            out[qi] = _postprocess(ids[j][ok], sims[j][ok], data, int(tenant), k, params, days)
    return out


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
    try:
        import faiss

        faiss_version = faiss.__version__
    except ImportError:
        faiss_version = None
    return {
        "machine": {
            "host": socket.gethostname(),
            "platform": platform.platform(),
            "processor": platform.processor() or platform.machine(),
            "cpus": os.cpu_count(),
            "torch_threads": torch.get_num_threads(),
            "cuda": torch.cuda.is_available(),
            "gpu": torch.cuda.get_device_name() if torch.cuda.is_available() else None,
        },
        "versions": {
            "python": platform.python_version(),
            "numpy": np.__version__,
            "torch": torch.__version__,
            "faiss": faiss_version,
        },
    }


def calibrate_oversample(run: Callable[[int], list[list[int]]], truth: list[list[int]], k: int, n: int,
                         target: float, limit: int | None = None) -> tuple[int, list[list[int]]]:
    """Smallest oversampling factor in 1, 2, 4, ... whose recall reaches ``target`` -> (factor, result).

    Stops at ``k * factor >= n`` (a flat search then returns every row: exact) or at ``limit`` neighbours
    (FAISS GPU indexes stop at 2048), where the result may stay below the target (its recall is reported).
    """
    factor = 1
    while True:
        got = run(factor)
        top = k * factor >= n or (limit is not None and k * factor * 2 > limit)
        if recall_at_k(got, truth) >= target or top:
            return factor, got
        factor *= 2


def _bench_device(backend: str, device: str | None) -> str:
    """Where the fused columns live: ``device`` when given; CUDA for triton/auto when present; else CPU."""
    if device is None:
        device = "cuda" if torch.cuda.is_available() and backend in ("auto", "triton") else "cpu"
    if device.startswith("cuda") and not torch.cuda.is_available():
        raise ValueError(f"device: {device!r} asked for, but torch sees no CUDA device")
    if backend == "triton" and not device.startswith("cuda"):
        # NOTE: on CPU tensors Triton runs only in its interpreter (tests; ~100x slower than torch),
        # which is no figure to benchmark.
        raise ValueError("backend: 'triton' is benchmarked compiled, on CUDA only (no CUDA device here); use torch or auto")
    return device


def run_memory_bench(
    sizes: list[int],
    dim: int = 384,
    n_queries: int = 64,
    k: int = 20,
    repeats: int = 3,
    seed: int = 0,
    backend: str = "torch",
    progress: Callable[[str, float | None], None] | None = None,
    *,
    device: str | None = None,
    vector_dtype: str = "float32",
    target_recall: float = 0.99,
    threads: int | None = None,
) -> list[dict[str, Any]]:
    """Run every pipeline at each size; one JSON-ready row per (size, method).

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
        device: where the fused / unfused columns live (default: CUDA for auto/triton when present).
        vector_dtype: storage of the fused path's vectors (float32, float16, bfloat16).
        target_recall: the recall the calibrated baselines (``...@0.99``) are oversampled to.
        threads: CPU threads of torch and FAISS for the run (restored after); None keeps torch's default.
            NOTE: on a loaded shared machine 1 thread is steadier (OpenMP barriers spin).

    Returns:
        Rows with ``size, method, ms_per_batch, ms_runs, speedup_vs_naive, recall, ...``; the fused row
        also has ``best_baseline`` / ``speedup_vs_best_baseline`` (the fastest other method whose recall
        reaches ``target_recall``); CUDA rows of the fused / unfused paths have ``gbps`` and
        ``fraction_of_peak`` (bytes the kernel must read / whole search time, against the datasheet).

    Raises:
        ValueError: a CUDA device or the triton backend asked for without CUDA.
    """
    device = _bench_device(backend, device)
    try:
        import faiss
    except ImportError:  # NOTE: a bare GPU machine: the FAISS baselines are left out, the torch ones run.
        faiss = None
    old_threads = torch.get_num_threads()
    if threads is not None:
        if threads < 1:
            raise ValueError(f"threads: must be >= 1, got {threads}")
        torch.set_num_threads(threads)
        if faiss is not None:
            faiss.omp_set_num_threads(threads)
    try:
        return _run(sizes, dim, n_queries, k, repeats, seed, backend, progress, device, vector_dtype, target_recall, faiss)
    finally:
        torch.set_num_threads(old_threads)
        if faiss is not None:
            faiss.omp_set_num_threads(old_threads)


def _run(sizes, dim, n_queries, k, repeats, seed, backend, progress, device, vector_dtype, target_recall, faiss):
    note = progress or (lambda msg, frac: None)
    env = _environment()
    params = ScoreParams(decay="hyperbolic", decay_lambda=0.1, combine="product", threshold=0.35)
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cuda = device.startswith("cuda")
    rows: list[dict[str, Any]] = []
    for n in sizes:
        note(f"{n:,} rows: generating data", 0.0)
        data = make_bench_data(n, dim, n_queries, seed, progress=lambda done, n=n: note(f"{n:,} rows: generating data", done / n))
        days = _days(data)
        note(f"{n:,} rows: exact ground truth", None)
        truth = exact_topk(data, k, params, days)
        cols = data.columns(device, vector_dtype)
        cols32 = cols if vector_dtype == "float32" else data.columns(device)
        methods: dict[str, Callable[[], list[list[int]]]] = {}
        extra: dict[str, dict[str, Any]] = {}

        def calibrated(name: str, run: Callable[[int], list[list[int]]], limit: int | None = None) -> None:
            note(f"{n:,} rows: calibrating {name}", None)
            factor, _ = calibrate_oversample(run, truth, k, n, target_recall, limit)
            methods[name] = lambda: run(factor)
            extra[name] = {"oversample": factor}

        if faiss is not None:
            note(f"{n:,} rows: building IndexFlatIP", None)
            index = faiss.IndexFlatIP(dim)
            index.add(data.vectors)
            methods["naive"] = lambda: naive_pipeline(index, data, k, params)
            methods["faiss+numpy"] = lambda: numpy_pipeline(index, data, k, params, days)
            calibrated(f"faiss+numpy@{target_recall}", lambda f: numpy_pipeline(index, data, k, params, days, f))
            calibrated(f"faiss-idselector@{target_recall}", lambda f: idselector_pipeline(index, data, k, params, days, f))
            if cuda and faiss_gpu_available():
                gpu_index = faiss.index_cpu_to_gpu(faiss.StandardGpuResources(), torch.device(device).index or 0, index)
                calibrated(f"faiss-gpu+numpy@{target_recall}", lambda f: numpy_pipeline(gpu_index, data, k, params, days, f),
                           limit=2048)
        methods["unfused-torch"] = lambda: unfused_torch_pipeline(data, cols32, k, params)
        methods["fused"] = lambda: fused_pipeline(data, k, params, backend, cols)
        results: dict[str, tuple[list[list[int]], list[float]]] = {}
        for name, fn in methods.items():
            note(f"{n:,} rows: warm-up {name}", None)
            results[name] = (fn(), [])  # NOTE: warm-up (allocations, thread pools, compiles) not timed.
        # NOTE: methods alternate inside each repeat so a change of machine load (shared CPUs)
        # hits all of them alike instead of biasing whichever ran during the spike.
        for rep in range(repeats):
            for name, fn in methods.items():
                note(f"{n:,} rows: {name} run {rep + 1}/{repeats}", (rep + 0.5) / repeats)
                if cuda:
                    torch.cuda.synchronize()
                got, times = _timed(fn, 1)
                results[name] = (got, results[name][1] + times)
        ref = "naive" if "naive" in results else "unfused-torch"
        base = statistics.median(results[ref][1])
        base_min = min(results[ref][1])
        mean_truth = float(np.mean([len(t) for t in truth]))
        size_rows = []
        for name, (got, times) in results.items():
            med = statistics.median(times)
            row = {
                **env,
                "timestamp": stamp,
                "size": n,
                "dim": dim,
                "queries": n_queries,
                "k": k,
                "params": params.model_dump(),
                "backend": backend if name == "fused" else ("torch" if name == "unfused-torch" else "faiss"),
                "device": device if name in ("fused", "unfused-torch") or "gpu" in name else "cpu",
                "vector_dtype": vector_dtype if name == "fused" else "float32",
                "method": name,
                "ms_per_batch": round(med, 3),
                "ms_runs": [round(t, 3) for t in times],
                "baseline": ref,
                "speedup_vs_naive": round(base / med, 3),
                "ms_min": round(min(times), 3),
                "speedup_vs_naive_min": round(base_min / min(times), 3),
                "recall": round(recall_at_k(got, truth), 4),
                "mean_results": round(float(np.mean([len(g) for g in got])), 2),
                "mean_truth_results": round(mean_truth, 2),
                "visible_share": round(float(np.mean(data.expires > data.now)), 3),
                **extra.get(name, {}),
            }
            if cuda and name in ("fused", "unfused-torch"):
                elem = torch.empty(0, dtype=DTYPES[row["vector_dtype"]]).element_size()
                gbps = scan_bytes(n, dim, n_queries, vector_bytes=elem) / (med * 1e-3) / 1e9
                peak = _peak_for(env["machine"]["gpu"] or "")
                row.update(gbps=round(gbps, 1), peak_gbps=peak, fraction_of_peak=round(gbps / peak, 3) if peak else None)
            size_rows.append(row)
        fused = size_rows[-1]
        ok = [r for r in size_rows[:-1] if r["recall"] >= target_recall]
        if ok:
            best = min(ok, key=lambda r: r["ms_per_batch"])
            fused["best_baseline"] = best["method"]
            fused["speedup_vs_best_baseline"] = round(best["ms_per_batch"] / fused["ms_per_batch"], 3)
        rows.extend(size_rows)
        del data, cols, cols32
    return rows
