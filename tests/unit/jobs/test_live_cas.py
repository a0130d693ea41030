"""Compare-and-set writes of the maintenance jobs on a real shard folder in tmp_path (no Ray):
``MemoryShard.apply_if_unchanged``, paging in id order, and the sweep/consolidation batches
racing a user's write between their read and their write (the live mode's situation)."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pytest

from recallserve.deployments.jobs import JobError, JobOptions, LiveOptions, run_access_job
from recallserve.memory_shards.shard_access import LocalShardAccess, SortedIds, page_records
from recallserve.deployments.jobs.consolidate import consolidate
from recallserve.deployments.jobs.expiry_sweep import ARCHIVAL_TIER, sweep
from recallserve.memory_shards import HashingEmbedder, MemoryRecord, MemoryShard, ShardConfig, embed_records
from recallserve.memory_shards.shard import record_version

EMB = HashingEmbedder(64)
NOW = 1_800_000_000.0
DAY = 86400.0


def _open(root: Path, index: int = 0) -> MemoryShard:
    return MemoryShard(ShardConfig(shard_id=index, data_dir=str(root / f"shard-{index}"), model_id=EMB.model_id, dim=EMB.dim))


def _rec(rid: str, text: str, *, tenant: str = "t1", age_days: float = 0.0, expires_in_days: float | None = None,
         source: str | None = None) -> MemoryRecord:
    return MemoryRecord(id=rid, tenant=tenant, source_id=source or f"src-{rid}", text=text, created_at=NOW - age_days * DAY,
                        expires_at=None if expires_in_days is None else NOW + expires_in_days * DAY)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """One shard: a fresh record, an expired one, an old (decayed) one, two duplicates."""
    root = tmp_path / "memory"
    shard = _open(root)
    try:
        shard.upsert(embed_records(EMB, [
            _rec("a-fresh", "Customer 17 prefers email over phone calls."),
            _rec("b-expired", "Promo code SPRING expires soon.", age_days=200, expires_in_days=-10),
            _rec("c-old", "The office moved to building C last spring.", age_days=60),
            _rec("d-dup-old", "The printer on floor 3 jams with thick paper.", age_days=5),
            _rec("e-dup-new", "The printer on floor 3 jams with thick paper!", age_days=1),
        ]))
    finally:
        shard.close()
    return root


def _opts(root: Path, **kw) -> JobOptions:
    return JobOptions(data_dir=root, model_id=EMB.model_id, dim=EMB.dim, progress=False, **kw)


def _records(root: Path) -> dict[str, MemoryRecord]:
    shard = _open(root)
    try:
        return {r.id: r for r in shard.records()}
    finally:
        shard.close()


def test_record_version_ignores_recall_renewal_only(root: Path) -> None:
    shard = _open(root)
    try:
        rec = shard.record("a-fresh")
        assert rec is not None and shard.record("nope") is None
        before = record_version(rec)
        shard.touch(["a-fresh"], NOW + DAY)
        shard.flush()
        renewed = shard.record("a-fresh")
        assert renewed is not None and renewed.last_access_at == NOW + DAY
        assert record_version(renewed) == before
        assert record_version(rec.model_copy(update={"text": "Customer 17 prefers SMS."})) != before
        assert record_version(rec.model_copy(update={"metadata": {"tier": "archival"}})) != before
    finally:
        shard.close()


def test_apply_skips_records_written_since_the_read(root: Path, tmp_path: Path) -> None:
    shard = _open(root)
    try:
        read = {r.id: r for r in shard.records()}
        expected = {rid: record_version(r) for rid, r in read.items()}
        # A user rewrites b-expired (no longer expiring) and deletes c-old after the job read them.
        shard.upsert(embed_records(EMB, [_rec("b-expired", "Promo code SPRING extended to June.", age_days=1)]))
        shard.delete("t1", ["c-old"])
        shard.touch(["a-fresh"], NOW + 5 * DAY)  # a recall: not a conflict
        demoted = [read["c-old"].model_copy(update={"metadata": {"tier": ARCHIVAL_TIER}}),
                   read["a-fresh"].model_copy(update={"metadata": {"tier": ARCHIVAL_TIER}})]
        vectors = {rid: shard.vectors(rid) for rid in ("a-fresh", "d-dup-old")}
        out = shard.apply_if_unchanged(
            {"t1": ["b-expired", "d-dup-old"]},
            embed_records(EMB, demoted),
            expected,
            touches={"e-dup-new": NOW + 9 * DAY},
        )
        assert sorted(out["conflicts"]) == ["b-expired", "c-old"]
        assert out["deleted"] == ["d-dup-old"] and out["upserted"] == ["a-fresh"] and out["touched"] == ["e-dup-new"]
        now_b = shard.record("b-expired")
        assert now_b is not None and now_b.text == "Promo code SPRING extended to June."  # the newer write stands
        assert shard.record("c-old") is None  # never resurrected by the demotion
        a = shard.record("a-fresh")
        assert a is not None and a.metadata["tier"] == ARCHIVAL_TIER
        assert a.last_access_at == NOW + 5 * DAY  # the recall since the read is kept
        np.testing.assert_allclose(shard.vectors("a-fresh"), vectors["a-fresh"], atol=1e-6)
        # Durable on return: a copy of the folder (as after a crash) replays the same state.
        copy = tmp_path / "copy"
        shutil.copytree(root / "shard-0", copy / "shard-0", ignore=shutil.ignore_patterns("LOCK"))
        replayed = _records(copy)
        assert "d-dup-old" not in replayed and replayed["a-fresh"].metadata["tier"] == ARCHIVAL_TIER
        assert replayed["e-dup-new"].last_access_at == NOW + 9 * DAY
        assert replayed["b-expired"].text == "Promo code SPRING extended to June."
    finally:
        shard.close()


def test_apply_all_or_nothing_and_missing_versions(root: Path) -> None:
    shard = _open(root)
    try:
        d, e = shard.record("d-dup-old"), shard.record("e-dup-new")
        assert d is not None and e is not None
        expected = {d.id: record_version(d), e.id: record_version(e)}
        shard.upsert(embed_records(EMB, [e.model_copy(update={"text": "Floor 3 printer fixed."})]))
        out = shard.apply_if_unchanged({"t1": [d.id]}, [], expected, {e.id: NOW}, all_or_nothing=True)
        assert out == {"deleted": [], "upserted": [], "touched": [], "conflicts": [e.id]}
        assert shard.record(d.id) is not None  # the duplicate of a rewritten memory is kept
        with pytest.raises(ValueError, match="expected"):
            shard.apply_if_unchanged({"t1": [d.id]}, [], {})
    finally:
        shard.close()


def test_page_walks_every_record_in_id_order(root: Path) -> None:
    shard = _open(root)
    try:
        ids = SortedIds()
        seen, after = [], None
        while batch := page_records(shard, ids, after, 2):
            assert all(item.vectors.shape == (1, EMB.dim) for item in batch)
            seen += [item.record.id for item in batch]
            after = seen[-1]
        assert seen == sorted(r.id for r in shard.records())
        assert [i.record.id for i in page_records(shard, SortedIds(), "c-old", 10)] == ["d-dup-old", "e-dup-new"]
        shard.delete("t1", ["d-dup-old"])  # deleted after the id list was built: skipped
        assert [i.record.id for i in page_records(shard, ids, "c-old", 10)] == ["e-dup-new"]
        with pytest.raises(ValueError, match="limit"):
            page_records(shard, ids, None, 0)
    finally:
        shard.close()


def _race(monkeypatch: pytest.MonkeyPatch, method: str, write) -> None:  # type: ignore[no-untyped-def]
    """Make the user write ``write(shard)`` land right after the job's first non-empty ``method`` read."""
    original = getattr(LocalShardAccess, method)
    done: list[bool] = []

    def read(self: LocalShardAccess, *args):  # type: ignore[no-untyped-def]
        out = original(self, *args)
        if len(out) > 1 and not done:
            done.append(True)
            write(self.shard)
        return out

    monkeypatch.setattr(LocalShardAccess, method, read)


def test_sweep_never_overwrites_a_newer_user_write(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def user(shard: MemoryShard) -> None:
        shard.upsert(embed_records(EMB, [_rec("b-expired", "Promo code SPRING now runs until June.", age_days=1)]))
        old = shard.record("c-old")
        assert old is not None
        shard.upsert(embed_records(EMB, [old.model_copy(update={"text": "The office moved to building D."})]))

    _race(monkeypatch, "page", user)
    report = sweep(_opts(root), now=NOW)
    assert report.stats["conflicts"] == 2
    assert report.stats["expired_deleted"] == 0 and report.stats["demoted"] == 0
    recs = _records(root)
    assert recs["b-expired"].text == "Promo code SPRING now runs until June."
    assert recs["c-old"].text == "The office moved to building D." and "tier" not in recs["c-old"].metadata


def test_consolidate_skips_a_group_whose_member_changed(root: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def user(shard: MemoryShard) -> None:
        # The copy the merge would keep is updated by its owner after the job found the group.
        kept = shard.record("e-dup-new")
        assert kept is not None
        shard.upsert(embed_records(EMB, [kept.model_copy(update={"metadata": {"pinned": True}})]))

    _race(monkeypatch, "neighbours", user)
    report = consolidate(_opts(root), threshold=0.9)
    # Both groups (found from d-dup-old, then from the stale page copy of e-dup-new) are skipped whole.
    assert report.stats["duplicates_deleted"] == 0 and report.stats["groups"] == 0
    assert report.stats["conflicts"] == 2
    recs = _records(root)
    assert {"d-dup-old", "e-dup-new"} <= set(recs) and recs["e-dup-new"].metadata == {"pinned": True}
    # Rerun with a fresh read: now the merge happens.
    again = consolidate(_opts(root, restart=True), threshold=0.9)
    assert again.stats["duplicates_deleted"] == 1 and "d-dup-old" not in _records(root)


def test_access_job_checkpoints_and_resumes_by_page(root: Path) -> None:
    seen: list[str] = []

    def failing(_params):  # type: ignore[no-untyped-def]
        def batch(access, items, dry_run):  # type: ignore[no-untyped-def]
            if len(seen) >= 2:
                raise KeyboardInterrupt
            seen.extend(i.record.id for i in items)
            return {}
        return batch

    with pytest.raises(KeyboardInterrupt):
        run_access_job("probe", _opts(root, batch_size=2), {"x": 1}, failing)
    rest: list[str] = []

    def recording(_params):  # type: ignore[no-untyped-def]
        def batch(access, items, dry_run):  # type: ignore[no-untyped-def]
            rest.extend(i.record.id for i in items)
            return {}
        return batch

    report = run_access_job("probe", _opts(root, batch_size=2), {"x": 1}, recording)
    assert report.resumed and seen + rest == sorted(_records(root))
    assert report.stats["seen"] == 5


def test_live_flags_and_no_cluster_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import argparse

    from recallserve.deployments.jobs import _args
    from recallserve.deployments.jobs._live import connect
    from recallserve.deployments.jobs.expiry_sweep import add_arguments

    p = argparse.ArgumentParser()
    _args.add_common_arguments(p)
    add_arguments(p)
    live = _args.live_from_args(p.parse_args(["--live"]))
    assert live.app == "recallserve" and live.temp_dir == Path(".recallserve/ray")  # what `recallserve up` deploys
    assert _args.live_from_args(p.parse_args(["--live", "--app", "other"])).app == "other"
    with pytest.raises(ValueError, match="--app"):
        _args.live_from_args(p.parse_args(["--app", "other"]))
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    with pytest.raises(JobError, match="no running Ray cluster") as err, connect(LiveOptions(app="x", temp_dir=tmp_path / "ray")):
        pass
    assert "\n" not in str(err.value)
