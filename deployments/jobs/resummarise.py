"""Re-summarise long sessions: fold every session's unsummarised messages into its rolling summary.

A session is selected when ``unsummarised = message_count - 1 - summary.until_seq`` is at least
``--min-unsummarised`` (default 40: twice the live cooldown of 20 messages, i.e. sessions the
request path fell behind on, or all sessions after a summariser change with ``--min-unsummarised 1``).
Each one goes through :meth:`recallserve.serve.context.ContextManager.refresh_summary` with ``force=True``
(trigger and cooldown ignored, the recent window still kept verbatim), so the job writes exactly
what the live path would, with the same compare-and-set (a refresh that raced a live one is
counted as ``superseded``, not overwritten).

Summariser: ``extractive`` (no model; default) or ``model`` (the profile's summariser engine,
e.g. llama.cpp on CPU, through :class:`recallserve.serve.context.LLMSummariser`).

Two ways to reach the sessions:
    ``--live``: through the running app's ``state`` deployment, the one writer of the session
        store, while it serves (``--summariser model`` then uses the app's summariser deployment).
        The way on a cluster: ``ray job submit -- python -m recallserve.deployments.jobs.resummarise --live``.
    the file: ``--store`` (default the profile's ``state_dir/sessions.sqlite3``) opened here; for a
        stopped cluster, or one on this machine (SQLite's locks keep the two writers apart on a
        local disk, not over NFS).

Resumable in session-id order (checkpoint ``<store>.jobs/resummarise.json``); ``--dry-run``
lists what would be summarised.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recallserve.deployments.engines import build_engine
from recallserve.deployments.jobs._args import add_live_arguments, live_from_args, run_main
from recallserve.deployments.jobs._live import connect
from recallserve.deployments.jobs._options import JobReport

__all__ = ["add_arguments", "default_store", "long_sessions", "resummarise", "resummarise_live", "resummarise_postgres",
           "run", "main"]

JOB = "resummarise"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of this job (it works on the session store, not on shards)."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", default=None, help="profile giving the summariser engine (with --summariser model)")
    src.add_argument("--config", type=Path, default=None, help="a profile YAML file instead")
    p.add_argument("--store", type=Path, default=None,
                   help="session store file (default: the profile's state_dir/sessions.sqlite3, what `recallserve up` "
                        "writes); on a running cluster prefer --live")
    p.add_argument("--state-dsn", default=None,
                   help="the cluster's PostgreSQL state database (state_db): its sessions are read and summarised "
                        "there, by this process (no --store, no --live)")
    p.add_argument("--min-unsummarised", type=int, default=40, help="select sessions with at least this many unsummarised messages")
    p.add_argument("--summariser", choices=("extractive", "model"), default="extractive", help="who writes the summaries")
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file (default <store>.jobs/resummarise.json)")
    p.add_argument("--restart", action="store_true", help="start over, ignoring an existing checkpoint")
    p.add_argument("--dry-run", action="store_true", help="list what would be summarised; write nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")
    add_live_arguments(p, via="the state deployment", instead_of="the store file")


def long_sessions(store_path: Path, min_unsummarised: int) -> list[tuple[str, str, str, int]]:
    """(session id, tenant, user, unsummarised count) of the sessions to refresh, by (id, tenant)
    (:meth:`recallserve.serve.context.SessionStore.long_sessions` on the file; WAL lets it read while the
    cluster writes)."""
    from recallserve.serve.context import SessionStore

    store = SessionStore(store_path)
    try:
        return asyncio.run(store.long_sessions(min_unsummarised))
    finally:
        store.close()


def _resume_key(last_id: str | None) -> tuple[str, str] | None:
    """The (session id, tenant) the checkpoint stopped after (the listing's order).

    The same id can exist once per tenant, so the position is the pair, saved as a JSON list.
    NOTE: a checkpoint written before the tenant key holds the bare id: ``(id, "")`` sorts before
    every tenant's session of that id, so a resumed run redoes those few (a refresh is idempotent).
    """
    if last_id is None:
        return None
    try:
        session_id, tenant = json.loads(last_id)
        return str(session_id), str(tenant)
    except (ValueError, TypeError):
        return last_id, ""


async def _work(store: Any, min_unsummarised: int, summariser: Any, ckpt: Any, dry_run: bool,
                progress: bool) -> dict[str, Any]:
    """List the long sessions of ``store`` after the checkpoint and refresh them (or count them)."""
    from tqdm import tqdm

    from recallserve.serve.context import ContextManager, SessionNotFoundError

    sessions = await store.long_sessions(min_unsummarised)
    after = None if ckpt.done(0) else _resume_key(ckpt.last_id(0))
    todo = [] if ckpt.done(0) else [s for s in sessions if after is None or (s[0], s[1]) > after]
    if dry_run:
        return {"sessions": len(todo), "would_fold_messages_at_most": sum(s[3] for s in todo)}
    ctx = ContextManager(store, summariser=summariser)
    for session_id, tenant, user, _pending in tqdm(todo, desc=JOB, unit="session", disable=not progress, leave=False):
        try:
            session = await store.get(tenant, user, session_id)
        except SessionNotFoundError:
            ckpt.add({"seen": 1, "deleted_meanwhile": 1})  # deleted by its user since the listing
            ckpt.save(0, json.dumps([session_id, tenant]), finished=False)
            continue
        before = session.summary.until_seq
        state = await ctx.refresh_summary(session, force=True)
        if state is None or state.until_seq == before:
            ckpt.add({"seen": 1, "superseded_or_empty": 1})
        else:
            ckpt.add({"seen": 1, "resummarised": 1, "messages_folded": state.until_seq - before})
        # NOTE: counters live in the checkpoint, so a resumed run reports the whole job.
        ckpt.save(0, json.dumps([session_id, tenant]), finished=False)
    ckpt.save(0, None, finished=True)
    return dict(ckpt.stats)


def _report(store: Any, *, min_unsummarised: int, summariser: Any, dry_run: bool, checkpoint: Path,
            restart: bool, progress: bool) -> Any:
    from recallserve.deployments.jobs._common import Checkpoint

    if min_unsummarised < 1:
        raise ValueError(f"min_unsummarised: must be >= 1, got {min_unsummarised}")
    start = time.monotonic()
    ckpt_path = None if dry_run else checkpoint
    ckpt = Checkpoint(ckpt_path, JOB, {"min_unsummarised": min_unsummarised}, restart=restart)
    stats = asyncio.run(_work(store, min_unsummarised, summariser, ckpt, dry_run, progress))
    return JobReport(job=JOB, dry_run=dry_run, resumed=ckpt.resumed, shards=0, stats=stats,
                     seconds=round(time.monotonic() - start, 3), checkpoint=None if ckpt_path is None else str(ckpt_path))


def resummarise(store_path: Path, *, min_unsummarised: int = 40, summariser: Any = None, dry_run: bool = False,
                checkpoint: Path | None = None, restart: bool = False, progress: bool = True) -> Any:
    """Refresh the summary of every long session in the store file; returns a :class:`JobReport`.

    Raises:
        ValueError: ``min_unsummarised`` < 1 or a missing store file (names the option).
    """
    from recallserve.serve.context import SessionStore

    if not store_path.is_file():
        raise ValueError(f"store: {store_path} is not a session store file (no cluster has written sessions there; "
                         "pass --store or the --profile/--config the cluster runs)")
    store = SessionStore(store_path)
    try:
        return _report(store, min_unsummarised=min_unsummarised, summariser=summariser, dry_run=dry_run,
                       checkpoint=checkpoint or _default_checkpoint(store_path), restart=restart, progress=progress)
    finally:
        store.close()


def resummarise_postgres(dsn: str, *, min_unsummarised: int = 40, summariser: Any = None, dry_run: bool = False,
                         checkpoint: Path, restart: bool = False, progress: bool = True) -> Any:
    """The same job on a cluster whose sessions live in PostgreSQL (``state_db``): the database
    takes any number of writers, so the job talks to it directly, beside the ingress replicas
    (each summary is a compare-and-set: a refresh that lost the race is dropped)."""
    from recallserve.serve.context import SessionStore
    from recallserve.serve.statedb import PostgresDatabase

    db = PostgresDatabase(dsn, pool_size=2)
    try:
        return _report(SessionStore(db=db), min_unsummarised=min_unsummarised, summariser=summariser,
                       dry_run=dry_run, checkpoint=checkpoint, restart=restart, progress=progress)
    finally:
        db.close()


def resummarise_live(live: Any, *, min_unsummarised: int = 40, summariser: Callable[[Any], Any] | None = None,
                     dry_run: bool = False, checkpoint: Path, restart: bool = False, progress: bool = True) -> Any:
    """The same job through the running app's ``state`` deployment (the one writer of the sessions).

    Args:
        live: :class:`recallserve.deployments.jobs.LiveOptions` (which cluster and app).
        summariser: ``summariser(cluster) -> Summariser`` (e.g. over the app's summariser
            deployment); None = the extractive summariser.

    Raises:
        JobError: no cluster, app or ``state`` deployment (an app deployed before it existed).
    """
    from recallserve.deployments.state import RemoteStore

    with connect(live) as cluster:
        store = RemoteStore(cluster.handle("state"), "sessions")
        return _report(store, min_unsummarised=min_unsummarised, summariser=None if summariser is None else summariser(cluster),
                       dry_run=dry_run, checkpoint=checkpoint, restart=restart, progress=progress)


def _default_checkpoint(store_path: Path) -> Path:
    return store_path.with_name(store_path.name + ".jobs") / f"{JOB}.json"


def _summariser(args: argparse.Namespace) -> Any:
    if args.summariser == "extractive":
        return None  # NOTE: ContextManager's default ExtractiveSummariser
    from recallserve.deployments.config import load_config
    from recallserve.serve.context import LLMSummariser

    config = load_config(profile=args.profile, path=args.config)
    return LLMSummariser(build_engine(config.summariser.engine))


def default_store(profile: str | None, config_path: Path | None) -> Path:
    """The session store of the cluster that ``profile`` (or the config file) starts:
    ``<state_dir>/sessions.sqlite3``, the file the ``state`` deployment opens."""
    from recallserve.deployments.config import load_config

    return load_config(profile=profile, path=config_path).state_dir.expanduser().resolve() / "sessions.sqlite3"


def _live_summariser(args: argparse.Namespace) -> Callable[[Any], Any] | None:
    """With --live and ``--summariser model``: the app's own summariser deployment, not a local model."""
    if args.summariser == "extractive":
        return None
    from recallserve.deployments.config import load_config
    from recallserve.deployments.handles import HandleEngine
    from recallserve.deployments.ingress import engine_facts
    from recallserve.serve.context import LLMSummariser

    config = load_config(profile=args.profile, path=args.config)
    # NOTE: in cpu-local the summariser runs on the reasoner's deployment (summariser.shared_with).
    name = config.role_deployment("summariser")
    return lambda cluster: LLMSummariser(HandleEngine(cluster.handle(name), "summariser", *engine_facts(config.summariser.engine)))


def run(args: argparse.Namespace) -> Any:
    """Entry used by both ``recallserve job resummarise`` and ``python -m``."""
    live = live_from_args(args)
    if args.state_dsn:
        if args.store is not None or live is not None:
            raise ValueError("--state-dsn: not used with --store or --live (the sessions are in that database)")
        checkpoint = args.checkpoint or _default_checkpoint(default_store(args.profile, args.config))
        return resummarise_postgres(args.state_dsn, min_unsummarised=args.min_unsummarised,
                                    summariser=_summariser(args), dry_run=args.dry_run, checkpoint=checkpoint,
                                    restart=args.restart, progress=not args.no_progress)
    if live is None:
        store = args.store or default_store(args.profile, args.config)
        return resummarise(store, min_unsummarised=args.min_unsummarised,
                           summariser=_summariser(args), dry_run=args.dry_run, checkpoint=args.checkpoint,
                           restart=args.restart, progress=not args.no_progress)
    if args.store is not None:
        raise ValueError("--store: not used with --live (the sessions are those of the running app's state deployment)")
    checkpoint = args.checkpoint or _default_checkpoint(default_store(args.profile, args.config))
    return resummarise_live(live, min_unsummarised=args.min_unsummarised, summariser=_live_summariser(args),
                            dry_run=args.dry_run, checkpoint=checkpoint, restart=args.restart,
                            progress=not args.no_progress)


def main(argv: list[str] | None = None) -> int:
    return run_main(JOB, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
