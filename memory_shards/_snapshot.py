"""Shard snapshots: ``.npy`` vectors + columns, JSON-lines records, a ``meta.json`` written last.

Layout of ``<data_dir>/snap-<seq, 12 digits>/``::

    vectors.npy     float32 [rows, dim]   live rows in row order
    <column>.npy    one per column of :data:`recallserve.memory_shards._table.COLUMNS` (inspection, checks)
    records.jsonl   one MemoryRecord JSON per line, in row order (rows per record = its texts)
    meta.json       {"format": 1, "seq", "dim", "model_id", "rows", "records"}

A snapshot is written into ``.tmp-snap-*``, every file fsync'ed, ``meta.json`` last, then the
folder is renamed into place: a crash mid-snapshot leaves only a temp folder that load ignores.
Nothing is pickled (``np.load(allow_pickle=False)``).
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import numpy as np
import torch

from ._table import COLUMNS, RowTable
from ._wal import fsync_dir
from .records import MemoryRecord

__all__ = ["write_snapshot", "load_latest_snapshot", "SnapshotError"]

FORMAT = 1


class SnapshotError(RuntimeError):
    """A snapshot folder is inconsistent (wrong shapes, dim or model)."""


def _fsync_file(path: Path) -> None:
    with path.open("rb+") as fh:
        os.fsync(fh.fileno())


def write_snapshot(data_dir: Path, table: RowTable, seq: int, model_id: str) -> Path:
    """Write ``table`` (compacted) as the snapshot at ``seq``; delete older snapshots.

    Returns:
        The snapshot folder.
    """
    live = table if table.dead_rows == 0 else table.compacted()
    tmp = data_dir / f".tmp-snap-{seq:012d}"
    final = data_dir / f"snap-{seq:012d}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir(parents=True)
    files = []
    np.save(tmp / "vectors.npy", live.vectors[: live.n])
    files.append(tmp / "vectors.npy")
    for name in COLUMNS:
        np.save(tmp / f"{name}.npy", live.col(name))
        files.append(tmp / f"{name}.npy")
    records = live.records()
    with (tmp / "records.jsonl").open("w", encoding="utf-8") as fh:
        for record in records:
            fh.write(record.model_dump_json())
            fh.write("\n")
    files.append(tmp / "records.jsonl")
    for path in files:
        _fsync_file(path)
    meta = {"format": FORMAT, "seq": seq, "dim": table.dim, "model_id": model_id, "rows": live.n, "records": len(records)}
    (tmp / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    _fsync_file(tmp / "meta.json")
    fsync_dir(tmp)
    if final.exists():
        shutil.rmtree(final)
    os.replace(tmp, final)
    fsync_dir(data_dir)
    for old in data_dir.glob("snap-*"):
        if old != final and old.is_dir():
            shutil.rmtree(old)
    return final


def load_latest_snapshot(
    data_dir: Path, dim: int, model_id: str, device: torch.device | None = None,
    dtype: torch.dtype = torch.float32,
) -> tuple[RowTable, int]:
    """Load the newest complete snapshot -> (table, seq); an empty table and seq 0 when none.

    ``device`` / ``dtype`` place the table's kernel columns (the files are the same for all).

    Raises:
        SnapshotError: the snapshot disagrees with the shard's dim or model, or with itself.
    """
    for tmp in data_dir.glob(".tmp-snap-*"):
        shutil.rmtree(tmp, ignore_errors=True)
    complete = sorted(p for p in data_dir.glob("snap-*") if (p / "meta.json").exists())
    if not complete:
        return RowTable(dim, device=device, dtype=dtype), 0
    folder = complete[-1]
    # NOTE: a crash between a snapshot's rename and the removal of its predecessors leaves these;
    # they may hold records erased since, so they go before the shard serves.
    for old in data_dir.glob("snap-*"):
        if old != folder and old.is_dir():
            shutil.rmtree(old)
    meta = json.loads((folder / "meta.json").read_text(encoding="utf-8"))
    if meta.get("format") != FORMAT:
        raise SnapshotError(f"{folder}: format {meta.get('format')} is not {FORMAT}")
    if meta["dim"] != dim or meta["model_id"] != model_id:
        raise SnapshotError(
            f"{folder}: holds dim={meta['dim']} model_id={meta['model_id']!r}, shard expects dim={dim} model_id={model_id!r}"
        )
    vectors = np.load(folder / "vectors.npy", allow_pickle=False)
    if vectors.shape != (meta["rows"], dim) or vectors.dtype != np.float32:
        raise SnapshotError(f"{folder}: vectors.npy has shape {vectors.shape} {vectors.dtype}, meta says ({meta['rows']}, {dim}) float32")
    table = RowTable(dim, capacity=max(meta["rows"], 1024), device=device, dtype=dtype)
    start = 0
    with (folder / "records.jsonl").open("r", encoding="utf-8") as fh:
        for line_no, line in enumerate(fh, 1):
            record = MemoryRecord.model_validate_json(line)
            rows = len(record.embedding_texts())
            if start + rows > vectors.shape[0]:
                raise SnapshotError(f"{folder}: records.jsonl line {line_no} needs rows beyond vectors.npy")
            table.add(record, vectors[start : start + rows])
            start += rows
    if start != vectors.shape[0] or len(table.by_id) != meta["records"]:
        raise SnapshotError(f"{folder}: {start} rows / {len(table.by_id)} records rebuilt, meta says {meta['rows']} / {meta['records']}")
    tenant = np.load(folder / "tenant.npy", allow_pickle=False)
    if not np.array_equal(tenant, table.col("tenant")):
        raise SnapshotError(f"{folder}: tenant.npy disagrees with records.jsonl")
    return table, int(meta["seq"])
