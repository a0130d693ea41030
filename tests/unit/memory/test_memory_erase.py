"""Erasure on disk: a user's records leave every WAL segment and snapshot, crash-safely; deletes by
id are purged within the configured time; a re-embed's fill or a consolidate batch never brings
erased records back (``MemoryShard.erase``, ``purge_deleted_within_s``)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from recallserve.memory_shards import EmbeddedRecord, MemoryPart, MemoryRecord, MemoryShard, ShardConfig
from recallserve.memory_shards.records import record_version

from .conftest import DIM, MODEL, unit


def _open(path: Path, **kw) -> MemoryShard:
    return MemoryShard(ShardConfig(model_id=MODEL, dim=DIM, data_dir=str(path), **kw))


def _files_holding(root: Path, needle: str) -> list[str]:
    """Every file under ``root`` whose bytes contain ``needle`` (UTF-8)."""
    raw = needle.encode()
    return [str(p) for p in root.rglob("*") if p.is_file() and raw in p.read_bytes()]


def _record(rng, tenant: str, user: str | None, tag: str, i: int) -> EmbeddedRecord:
    rec = MemoryRecord(tenant=tenant, user=user, source_id=f"src-{tag}-{i}", text=f"note {tag}-text-{i}",
                       ocr_text=f"receipt {tag}-ocr-{i}", parts=[MemoryPart(name="photo", text=f"{tag}-part-{i}")],
                       metadata={"k": f"{tag}-meta-{i}"})
    return EmbeddedRecord(rec, unit(rng, 3))


def _plant(shard: MemoryShard, rng) -> tuple[list[EmbeddedRecord], list[EmbeddedRecord]]:
    """u1's and u2's records of tenant a, half before a snapshot and half after (both file kinds)."""
    u1 = [_record(rng, "a", "u1", "zq-u1", i) for i in range(6)]
    u2 = [_record(rng, "a", "u2", "zq-u2", i) for i in range(6)]
    shard.upsert(u1[:3] + u2[:3])
    shard.snapshot()
    shard.upsert(u1[3:] + u2[3:])
    shard.touch([u1[0].record.id], time.time())
    shard.flush()
    return u1, u2


def _assert_erased(root: Path, u1: list[EmbeddedRecord], u2: list[EmbeddedRecord]) -> None:
    for item in u1:
        for needle in (item.record.text, item.record.ocr_text, item.record.parts[0].text, item.record.id,
                       item.record.source_id):
            assert _files_holding(root, needle) == [], f"{needle!r} still on disk"
    for item in u2:
        assert _files_holding(root, item.record.text), f"{item.record.text!r} of another user is gone"


def test_erase_rewrites_wal_and_snapshots_without_the_users_rows(tmp_path: Path, rng) -> None:
    shard = _open(tmp_path)
    u1, u2 = _plant(shard, rng)
    assert _files_holding(tmp_path, u1[0].record.text) and _files_holding(tmp_path, u1[5].record.text)
    erased = shard.erase("a", "u1")
    assert sorted(erased) == sorted(i.record.id for i in u1)
    _assert_erased(tmp_path, u1, u2)
    assert shard.owned("a", "u1") == [] and len(shard.owned("a", "u2")) == 6
    shard.close()
    again = _open(tmp_path)
    assert all(again.get("a", i.record.id) is None for i in u1)
    assert all(again.get("a", i.record.id) is not None for i in u2)
    again.close()
    _assert_erased(tmp_path, u1, u2)


def test_erase_of_a_tenant_leaves_other_tenants_and_shared_rows(tmp_path: Path, rng) -> None:
    shard = _open(tmp_path)
    mine = [_record(rng, "a", u, "zq-a", i) for i, u in enumerate(["u1", None, "u3"])]
    other = [_record(rng, "b", "u1", "zq-b", 0), _record(rng, "shared", None, "zq-shared", 0)]
    shard.upsert(mine + other)
    assert sorted(shard.erase("a", None)) == sorted(i.record.id for i in mine)
    _assert_erased(tmp_path, mine, other)
    with pytest.raises(ValueError, match="tenant"):
        shard.erase("shared", None)
    shard.close()


def test_a_crash_between_snapshot_and_segment_drop_is_cleaned_on_open(tmp_path: Path, rng) -> None:
    """The state a kill -9 leaves after the snapshot's rename: old segments and the old snapshot."""
    data = tmp_path / "shard"
    shard = _open(data)
    u1, u2 = _plant(shard, rng)
    kept = tmp_path / "before"
    shutil.copytree(data, kept, ignore=shutil.ignore_patterns("LOCK"))
    shard.erase("a", "u1")
    shard.close()
    for path in kept.iterdir():  # NOTE: put back what the erasure's snapshot replaced or unlinked
        if not (data / path.name).exists():
            (shutil.copytree if path.is_dir() else shutil.copy2)(path, data / path.name)
    assert _files_holding(data, u1[0].record.text)
    again = _open(data)
    _assert_erased(data, u1, u2)
    assert all(again.get("a", i.record.id) is None for i in u1)
    assert all(again.get("a", i.record.id) is not None for i in u2)
    again.close()


def test_a_crash_after_the_delete_entry_is_purged_by_the_erasures_rerun(tmp_path: Path, rng) -> None:
    """Delete logged, snapshot not written: the replay hides the rows and the re-run (the erasure
    service resumes unfinished erasures) rewrites the files even though nothing is left to delete."""
    shard = _open(tmp_path)
    u1, u2 = _plant(shard, rng)
    shard.delete("a", [i.record.id for i in u1])
    shard._purge_due = None  # NOTE: as a kill -9 before the scheduled purge
    shard._purge_timer.cancel()
    shard._wal.close()
    os.close(shard._lock_fd)
    shard._lock_fd = None
    again = _open(tmp_path)
    assert _files_holding(tmp_path, u1[0].record.text)
    assert again.erase("a", "u1") == []
    _assert_erased(tmp_path, u1, u2)
    again.close()


def test_a_deleted_memory_leaves_the_files_within_the_configured_time(tmp_path: Path, rng) -> None:
    shard = _open(tmp_path, purge_deleted_within_s=0.2)
    u1, u2 = _plant(shard, rng)
    shard.delete("a", [u1[0].record.id, u1[4].record.id])
    needles = [u1[0].record.text, u1[4].record.text, u1[0].record.id, u1[4].record.id]
    deadline = time.monotonic() + 10
    while any(_files_holding(tmp_path, n) for n in needles) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert [n for n in needles if _files_holding(tmp_path, n)] == []
    assert _files_holding(tmp_path, u1[1].record.text)
    shard.close()


def test_consolidate_and_reembed_fill_do_not_resurrect_erased_records(tmp_path: Path, rng) -> None:
    shard = _open(tmp_path)
    u1, u2 = _plant(shard, rng)
    read = {i.record.id: record_version(i.record) for i in u1}  # NOTE: what a job read before the erasure
    shard.erase("a", "u1")
    merged = u1[0].record.model_copy(update={"text": "merged zq-u1-text-0 and zq-u1-text-1"})
    out = shard.apply_if_unchanged({"a": [u1[1].record.id]}, [EmbeddedRecord(merged, unit(rng, 3))], read)
    assert out["upserted"] == [] and set(out["conflicts"]) == set(read)
    assert shard.insert_absent(u1) == []  # the live re-embed's fill of the new generation
    assert shard.insert_absent([_record(rng, "a", "u2", "zq-u2-new", 0)])  # others still fill
    _assert_erased(tmp_path, u1, u2)
    shard.close()


_ERASER = r"""
import sys, numpy as np
from recallserve.memory_shards import EmbeddedRecord, MemoryRecord, MemoryShard, ShardConfig
shard = MemoryShard(ShardConfig(model_id="test-model", dim=16, data_dir=sys.argv[1], snapshot_every_ops=50))
rng = np.random.default_rng(7)
def item(user, i):
    v = rng.standard_normal((1, 16)).astype(np.float32)
    return EmbeddedRecord(MemoryRecord(tenant="a", user=user, source_id=f"{user}-{i}", text=f"zq-{user}-secret-{i}"),
                          v / np.linalg.norm(v))
for b in range(40):
    shard.upsert([item("u1", 2 * b), item("u2", 2 * b), item("u1", 2 * b + 1)])
print("ready", flush=True)
shard.erase("a", "u1")
print("erased", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("delay", [0.0, 0.01, 0.05, 0.2])
def test_kill_9_mid_erasure_then_rerun_leaves_nothing(tmp_path: Path, delay: float) -> None:
    data = tmp_path / "shard"
    proc = subprocess.Popen([sys.executable, "-c", _ERASER, str(data)], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().strip() == "ready"
        time.sleep(delay)
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait()
        proc.stdout.close()
    shard = MemoryShard(ShardConfig(model_id="test-model", dim=16, data_dir=str(data)))
    assert len(shard.owned("a", "u2")) == 40  # every acknowledged write of the other user is there
    shard.erase("a", "u1")  # the erasure service's re-run
    shard.close()
    assert [p for i in range(80) for p in _files_holding(data, f"zq-u1-secret-{i}\"")] == []
    assert _files_holding(data, "zq-u2-secret-0\"")
