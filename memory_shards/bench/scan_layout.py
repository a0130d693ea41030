"""The shard's search over column-major vectors against row-major ones, in process.

A shard stores its vectors row-major while small and column-major from
``recallserve.memory_shards._device.COLUMN_MAJOR_MIN_ROWS`` rows of capacity (``vector_block``). This benchmark
builds one hybrid shard per size with the bench's rows (MiniLM vectors of ``--distinct`` bench texts
plus noise, as :func:`._rows.bulk_rows` writes them) and times two calls on the same rows stored
both ways (``np.ascontiguousarray`` / ``np.asfortranarray`` of the table's vectors):

* ``dense``: ``MemoryShard.search(queries, tenant, k=64, touch=False)`` for ``--queries`` stacked
  queries (the gathered scan; 1 = one search alone);
* ``hybrid``: ``HybridShard.hybrid_search`` of one query, dense top-64 + BM25 top-64 (what one
  search through the cluster asks of its shard; the BM25 hits' best parts gather their rows).

The layouts are timed alternately, call by call, so a neighbour's load falls on both, and each call
starts with cold caches, as a search through the cluster does. Row-major is
the baseline of every ratio. The answers are compared rank by rank: the same rows, or rows whose
scores tie to float rounding (the largest score gap is reported; over 1e-5 stops the run).

Figures: median and p95 wall ms per call, and the calling thread's CPU ms per call
(``time.thread_time``; torch runs on that thread with ``threads`` 1).

Example::

    recallserve bench scan-layout --rows 2000,100000 --queries 1,16 --out loadtests/results/scan-layout-cpu.json
"""

from __future__ import annotations

import random
import statistics
import time
from collections.abc import Callable

import numpy as np
import torch

from recallserve.kernels import ScoreParams

from .._device import COLUMN_MAJOR_MIN_ROWS
from ..config import ShardConfig
from ..embedders import build_embedder
from ..retrieval import HybridShard
from ..shard import MemoryShard
from ._rows import bulk_rows, query_text, ticket_text

__all__ = ["render", "run_scan_layout_bench"]


def _timed(fn: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.thread_time()
    fn()
    return 1e3 * (time.perf_counter() - wall), 1e3 * (time.thread_time() - cpu)


def _row(label: str, walls: list[float], cpus: list[float]) -> dict[str, float]:
    walls = sorted(walls)
    return {f"{label}_p50_ms": round(statistics.median(walls), 2),
            f"{label}_p95_ms": round(walls[min(len(walls) - 1, int(0.95 * len(walls)))], 2),
            f"{label}_cpu_ms": round(statistics.fmean(cpus), 2)}


def run_scan_layout_bench(sizes: list[int], counts: list[int], repeats: int = 0, distinct: int = 200,
                          threads: int = 1, progress: Callable[[str, float | None], None] | None = None) -> list[dict[str, float | int | bool | str]]:
    """One row per (size, call, queries): both layouts' p50 / p95 / CPU ms, the speed-up and the answers' agreement.

    Args:
        sizes: rows of the shard per measurement (1000-1000000).
        counts: queries per dense call (1-256); the hybrid call always has one.
        repeats: timed calls per layout (0: 40 below 50k rows, else 12).
        distinct: base texts embedded for the rows (50-5000).
        threads: torch threads (the shard replica's default is 1).
        progress: ``progress(message, fraction or None)`` after each row.

    Raises:
        ValueError: an argument out of its range.
        RuntimeError: the two layouts' answers differ by more than float rounding.
    """
    if not sizes or not all(1000 <= n <= 1_000_000 for n in sizes) or not counts or not all(1 <= q <= 256 for q in counts):
        raise ValueError(f"rows: sizes within [1000, 1000000]; queries: counts within [1, 256]; got {sizes} and {counts}")
    if not 50 <= distinct <= 5000 or not 0 <= repeats <= 1000 or not 1 <= threads <= 64:
        raise ValueError("distinct within [50, 5000], repeats within [0, 1000], threads within [1, 64]")
    torch.set_num_threads(threads)
    emb = build_embedder("all-MiniLM-L6-v2", device="cpu", batch_size=16, torch_threads=threads)
    rng = random.Random(0)
    words = [ticket_text(rng, i).split(": ", 1)[1][:-1] for i in range(distinct)]
    base = np.asarray(emb.embed(words), dtype=np.float32)
    asked = [query_text(rng) for _ in range(max(counts))]
    qv = np.asarray(emb.embed(asked), dtype=np.float32)
    params = ScoreParams(threshold=0.35)
    # NOTE: through the cluster a shard's caches are cold when a search arrives (the ingress's embed,
    # ~90 MB of weights, and the other processes ran in between): each timed call starts after a pass
    # over 64 MB, or a small table would be measured from the cache alone.
    flood = np.ones(16 * 2**20, dtype=np.float32)

    def evict() -> None:
        float(flood.sum())

    rows_out: list[dict[str, float | int | bool | str]] = []
    for n in sizes:
        shard = HybridShard(MemoryShard(ShardConfig(shard_id=0, model_id=emb.model_id, dim=emb.dim)))
        for lo in range(0, n, 10_000):
            shard.upsert(bulk_rows(min(n, lo + 10_000), distinct, base, words, "local", "layout", 0.2, 0, lo))
        table = shard.shard._table
        default = "column" if table.vectors.flags.f_contiguous else "row"
        layouts = {"row": np.ascontiguousarray(table.vectors), "column": np.asfortranarray(table.vectors)}
        own = table.vectors
        reps = repeats or (40 if n < 50_000 else 12)
        calls: list[tuple[str, int, Callable[[], list]]] = [
            ("dense", q, lambda q=q: shard.shard.search(qv[:q], "local", 64, params, None, time.time(), touch=False))
            for q in counts]
        calls.append(("hybrid", 1, lambda: [[h for h, _ in r.lexical] + list(r.dense) for r in [shard.hybrid_search(
            qv[0], asked[0], "local", 64, 64, params, None, time.time())]]))
        for call, q, fn in calls:

            def run(layout: str) -> list:
                table.vectors = layouts[layout]
                return fn()

            # NOTE: the two layouts sum each cosine's products in another order (BLAS blocking), so a
            # score may differ in its last bits and two rows whose scores tie to ~1e-7 may swap;
            # the score lists, rank by rank, must still agree to float rounding.
            a, b = run("row"), run("column")
            same = [[h.record.id for h in hs] for hs in a] == [[h.record.id for h in hs] for hs in b]
            gap = max((abs(x.score - y.score) for ha, hb in zip(a, b) for x, y in zip(ha, hb)), default=0.0)
            if not all(len(ha) == len(hb) for ha, hb in zip(a, b)) or gap >= 1e-5:
                raise RuntimeError(f"{n:,} rows, {call} x{q}: the layouts' answers differ (largest score gap {gap})")
            walls: dict[str, list[float]] = {"row": [], "column": []}
            cpus: dict[str, list[float]] = {"row": [], "column": []}
            for _ in range(reps):
                for layout in ("row", "column"):
                    evict()
                    w, c = _timed(lambda: run(layout))
                    walls[layout].append(w)
                    cpus[layout].append(c)
            table.vectors = own
            row: dict[str, float | int | bool | str] = {
                "rows": n, "call": call, "queries": q, "calls": reps, "shard_layout": default,
                "column_major_min_rows": COLUMN_MAJOR_MIN_ROWS, "same_rows": same, "max_score_gap": float(f"{gap:.1e}")}
            row.update(_row("row_major", walls["row"], cpus["row"]))
            row.update(_row("column_major", walls["column"], cpus["column"]))
            row["speedup_p50"] = round(row["row_major_p50_ms"] / row["column_major_p50_ms"], 2)  # type: ignore[operator]
            rows_out.append(row)
            if progress is not None:
                progress(f"{n:,} rows, {call} x{q}: {row['speedup_p50']}x", None)
        shard.close()
    return rows_out


def render(rows: list[dict[str, float | int | bool | str]]) -> str:
    """The rows of :func:`run_scan_layout_bench` as a Markdown table."""
    lines = ["| rows | call | queries | the shard's layout | row-major p50 / p95 ms | column-major p50 / p95 ms | speed-up (p50) | CPU ms row / column | same rows | largest score gap, rank by rank |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        lines.append(f"| {r['rows']:,} | {r['call']} | {r['queries']} | {r['shard_layout']} | {r['row_major_p50_ms']} / {r['row_major_p95_ms']} | "
                     f"{r['column_major_p50_ms']} / {r['column_major_p95_ms']} | **{r['speedup_p50']}x** | "
                     f"{r['row_major_cpu_ms']} / {r['column_major_cpu_ms']} | {r['same_rows']} | {r['max_score_gap']} |")
    return "\n".join(lines) + "\n"
