"""``recallserve bench restart``: how long a shard takes to open after a kill, with and without a snapshot.

A shard replica that dies is replaced by one that opens the same folder: it loads the newest
snapshot, then replays every WAL entry after it, then (on the cluster) rebuilds its BM25 index.
Until then every request that needs the shard answers 503. Three folders of the same ``records``
records are timed::

    wal_only        no snapshot: every record replayed from the WAL (no snapshot policy)
    snapshot        a snapshot of every record, empty WAL tail
    policy_worst    the largest WAL tail ``snapshot_every_ops`` allows after a snapshot
                    (snapshot_every_ops - 1 entries): the bound the policy gives

Each row has the shard open (snapshot load + WAL replay) and the BM25 rebuild, timed
separately, median of ``repeats`` opens.
"""

from __future__ import annotations

import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from ..config import ShardConfig
from ..records import EmbeddedRecord, MemoryRecord
from ..retrieval.shard import HybridShard
from ..shard import MemoryShard

__all__ = ["run_restart_bench"]

_MODEL = "bench-restart"
_BATCH = 1_000
_WORDS = ("printer", "tray", "refund", "invoice", "order", "battery", "screen", "router", "password", "shipment")


def _items(rng: np.random.Generator, start: int, n: int, dim: int) -> list[EmbeddedRecord]:
    vec = rng.standard_normal((n, dim)).astype(np.float32)
    vec /= np.linalg.norm(vec, axis=1, keepdims=True)
    out = []
    for j in range(n):
        i = start + j
        words = " ".join(_WORDS[(i * 7 + k) % len(_WORDS)] for k in range(24))
        rec = MemoryRecord(tenant=f"t{i % 16}", source_id=f"s{i}", text=f"ticket {i}: {words}", embedding_model=_MODEL,
                           metadata={"n": i})
        out.append(EmbeddedRecord(rec, vec[j : j + 1]))
    return out


def _config(folder: Path, dim: int, fsync: bool = True) -> ShardConfig:
    # NOTE: no automatic snapshots while the bench builds its folders: it places them itself.
    return ShardConfig(data_dir=str(folder), model_id=_MODEL, dim=dim, fsync=fsync, snapshot_every_ops=1 << 62,
                       snapshot_every_wal_mb=1 << 20)


def _fill(folder: Path, start: int, n: int, dim: int, rng: np.random.Generator,
          note: Callable[[str, float | None], None], label: str) -> None:
    # NOTE: fsync off while filling: it changes how fast the folder is written, not what replay reads.
    shard = MemoryShard(_config(folder, dim, fsync=False))
    try:
        for b in range(start, start + n, _BATCH):
            shard.upsert(_items(rng, b, min(_BATCH, start + n - b), dim))
            note(f"{label}: writing", (b - start + _BATCH) / n)
    finally:
        shard.close()


def _time_open(folder: Path, dim: int, repeats: int) -> dict[str, Any]:
    opens, bm25 = [], []
    stats: dict[str, Any] = {}
    for _ in range(repeats):
        t0 = time.perf_counter()
        shard = MemoryShard(_config(folder, dim))
        t1 = time.perf_counter()
        HybridShard(shard)
        t2 = time.perf_counter()
        stats = shard.stats()
        shard.close()
        opens.append(t1 - t0)
        bm25.append(t2 - t1)
    return {
        "open_s": round(statistics.median(opens), 3),
        "bm25_rebuild_s": round(statistics.median(bm25), 3),
        "restart_s": round(statistics.median(o + b for o, b in zip(opens, bm25)), 3),
        "open_runs_s": [round(x, 3) for x in opens],
        "records": stats.get("records"),
        "wal_entries_replayed": stats.get("wal_entries"),
    }


def run_restart_bench(records: int = 100_000, dim: int = 384, snapshot_every_ops: int | None = None, repeats: int = 3,
                      seed: int = 0, workdir: str | Path | None = None,
                      progress: Callable[[str, float | None], None] | None = None) -> list[dict[str, Any]]:
    """Time shard opens at ``records`` records: WAL only, fresh snapshot, worst tail under the policy.

    Args:
        records: records per shard.
        dim: vector dimension.
        snapshot_every_ops: the policy to bound (default: ``ShardConfig``'s).
        repeats: opens per folder (median reported).
        seed: vector seed.
        workdir: parent of the temporary shard folders (default: the system temp folder).
        progress: ``progress(message, fraction or None)``.

    Returns:
        One JSON-ready row per case.
    """
    note = progress or (lambda msg, frac: None)
    policy = snapshot_every_ops or ShardConfig.model_fields["snapshot_every_ops"].default
    tail = min(policy - 1, records)
    root = Path(tempfile.mkdtemp(prefix="restart-bench-", dir=workdir))
    stamp = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    rows = []
    try:
        rng = np.random.default_rng(seed)
        wal_only = root / "wal_only"
        _fill(wal_only, 0, records, dim, rng, note, "wal_only")
        snap = root / "snapshot"
        shutil.copytree(wal_only, snap)
        note("snapshot: writing the snapshot", None)
        t0 = time.perf_counter()
        shard = MemoryShard(_config(snap, dim))
        t_replay = time.perf_counter() - t0
        t0 = time.perf_counter()
        shard.snapshot()
        snapshot_write_s = time.perf_counter() - t0
        shard.close()
        worst = root / "policy_worst"
        # NOTE: new records after a snapshot (not rewrites, which would trigger a compaction):
        # the folder holds `records` records and the largest WAL tail the policy allows.
        _fill(worst, 0, records - tail, dim, np.random.default_rng(seed + 1), note, "policy_worst")
        shard = MemoryShard(_config(worst, dim))
        shard.snapshot()
        shard.close()
        _fill(worst, records - tail, tail, dim, np.random.default_rng(seed + 2), note, "policy_worst")
        cases = {"wal_only": (wal_only, records), "snapshot": (snap, 0), "policy_worst": (worst, tail)}
        for name, (folder, entries) in cases.items():
            note(f"{name}: timing {repeats} opens", None)
            row = _time_open(folder, dim, repeats)
            rows.append({"timestamp": stamp, "case": name, "records_total": records, "dim": dim,
                         "snapshot_every_ops": policy, "wal_tail_entries": entries,
                         "snapshot_write_s": round(snapshot_write_s, 3), "first_replay_s": round(t_replay, 3), **row})
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return rows
