"""``recallserve bench gather``: one shard under 1, 16, 64 concurrent one-query searches, with and
without gathering concurrent searches into one scan (:mod:`recallserve.memory_shards._gather`).

Each client is a thread in a closed loop (send, wait for the answer, send again) for ``seconds``;
a search is one query of one tenant, as the serving path's hybrid search sends. Rows report
throughput (answers / wall time), p50 / p95 latency, and the mean queries per scan.
"""

from __future__ import annotations

import platform
import statistics
import threading
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from recallserve.kernels import ScoreParams

from ..config import ShardConfig
from ..records import EmbeddedRecord, MemoryRecord
from ..shard import MemoryShard

__all__ = ["run_gather_bench"]

_NOW = 1.7e9


def _fill(shard: MemoryShard, rows: int, dim: int, seed: int) -> np.ndarray:
    """``rows`` one-row records of 16 tenants around 1000 centres; returns 256 query vectors."""
    rng = np.random.default_rng(seed)
    centres = rng.standard_normal((1000, dim)).astype(np.float32)
    for start in range(0, rows, 5000):
        m = min(5000, rows - start)
        v = centres[rng.integers(0, 1000, m)] + rng.standard_normal((m, dim)).astype(np.float32)
        v /= np.linalg.norm(v, axis=1, keepdims=True)
        shard.upsert([
            EmbeddedRecord(MemoryRecord(tenant=f"t{(start + i) % 16}", source_id=f"s{start + i}", text="m",
                                        created_at=_NOW - 1e6, last_access_at=_NOW - 86_400.0 * ((start + i) % 60)),
                           v[i : i + 1])
            for i in range(m)
        ])
    q = centres[rng.integers(0, 1000, 256)] + rng.standard_normal((256, dim)).astype(np.float32)
    return (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)


def _load(shard: MemoryShard, queries: np.ndarray, clients: int, seconds: float, k: int) -> dict[str, Any]:
    lat: list[float] = []
    lock = threading.Lock()
    stop = time.monotonic() + seconds
    before = shard.stats()

    def client(i: int) -> None:
        j = i
        while time.monotonic() < stop:
            t0 = time.perf_counter()
            shard.search(queries[j % len(queries)], f"t{j % 16}", k=k, params=ScoreParams(), now=_NOW, touch=False)
            with lock:
                lat.append((time.perf_counter() - t0) * 1e3)
            j += clients

    t0 = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,)) for i in range(clients)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    wall = time.perf_counter() - t0
    after = shard.stats()
    scans = after["search_batches"] - before["search_batches"]
    lat.sort()
    return {
        "clients": clients, "answers": len(lat), "seconds": round(wall, 2),
        "throughput_rps": round(len(lat) / wall, 2),
        "p50_ms": round(statistics.median(lat), 2),
        "p95_ms": round(lat[min(len(lat) - 1, int(0.95 * len(lat)))], 2),
        "queries_per_scan": round(len(lat) / scans, 2) if scans else 1.0,
    }


def run_gather_bench(rows: int, dim: int = 384, clients: list[int] | None = None, seconds: float = 5.0, k: int = 16,
                     seed: int = 0, progress: Callable[[str, float | None], None] | None = None) -> list[dict[str, Any]]:
    """Rows of ``{mode, clients, throughput_rps, p50_ms, p95_ms, queries_per_scan, ...}`` per mode and level.

    ``mode`` is ``alone`` (``gather_max_queries=0``: every search scans alone) or ``gathered``
    (the default: searches that arrive while one runs share the next scan). Same shard data,
    same queries, levels in the same order for both modes.
    """
    note = progress or (lambda msg, frac: None)
    clients = clients or [1, 16, 64]
    out: list[dict[str, Any]] = []
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    shards, queries = {}, None
    for mode, gather in (("alone", 0), ("gathered", 256)):
        note(f"{mode}: filling {rows:,} rows", None)
        shards[mode] = MemoryShard(ShardConfig(model_id="bench", dim=dim, gather_max_queries=gather))
        queries = _fill(shards[mode], rows, dim, seed)
        shards[mode].search(queries[0], "t0", k=k, now=_NOW, touch=False)  # NOTE: warm-up (allocations)
    # NOTE: the modes alternate at each level, so a change of machine load (shared CPUs) hits both alike.
    for level in clients:
        for mode, shard in shards.items():
            note(f"{mode}: {level} clients", None)
            row = _load(shard, queries, level, seconds, k)
            out.append({"timestamp": stamp, "mode": mode, "rows": rows, "dim": dim, "k": k,
                        "torch_threads": torch.get_num_threads(), "host": platform.node(), **row})
    for shard in shards.values():
        shard.close()
    return out
