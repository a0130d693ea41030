"""Re-summarise long sessions: fold every session's unsummarised messages into its rolling summary.

A session is selected when ``unsummarised = message_count - 1 - summary.until_seq`` is at least
``--min-unsummarised`` (default 40: twice the live cooldown of 20 messages, i.e. sessions the
request path fell behind on, or all sessions after a summariser change with ``--min-unsummarised 1``).
Each one goes through :meth:`serve.context.ContextManager.refresh_summary` with ``force=True``
(trigger and cooldown ignored, the recent window still kept verbatim), so the job writes exactly
what the live path would, with the same compare-and-set (a refresh that raced a live one is
counted as ``superseded``, not overwritten).

Summariser: ``extractive`` (no model; default) or ``model`` (the profile's summariser engine,
e.g. llama.cpp on CPU, through :class:`serve.context.LLMSummariser`).

Resumable in session-id order (checkpoint ``<store>.jobs/resummarise.json``); ``--dry-run``
lists what would be summarised. Run: ``recallserve job resummarise [--profile P]`` (the profile's
``state_dir/sessions.sqlite3``) or ``ray job submit -- python -m deployments.jobs.resummarise
--store /data/recallserve/state/sessions.sqlite3``.
"""

from __future__ import annotations

import argparse
import asyncio
import sqlite3
import sys
import time
from pathlib import Path
from typing import Any

__all__ = ["add_arguments", "default_store", "long_sessions", "resummarise", "run", "main"]

JOB = "resummarise"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of this job (it works on the session store, not on shards)."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", default=None, help="profile giving the summariser engine (with --summariser model)")
    src.add_argument("--config", type=Path, default=None, help="a profile YAML file instead")
    p.add_argument("--store", type=Path, default=None,
                   help="session store file (default: the profile's state_dir/sessions.sqlite3, what `recallserve up` "
                        "writes; give it under `ray job submit` or on Kubernetes, where state_dir is rendered elsewhere)")
    p.add_argument("--min-unsummarised", type=int, default=40, help="select sessions with at least this many unsummarised messages")
    p.add_argument("--summariser", choices=("extractive", "model"), default="extractive", help="who writes the summaries")
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file (default <store>.jobs/resummarise.json)")
    p.add_argument("--restart", action="store_true", help="start over, ignoring an existing checkpoint")
    p.add_argument("--dry-run", action="store_true", help="list what would be summarised; write nothing")
    p.add_argument("--no-progress", action="store_true", help="no progress bar")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def long_sessions(store_path: Path, min_unsummarised: int) -> list[tuple[str, str, str, int]]:
    """(session id, tenant, user, unsummarised count) of the sessions to refresh, by id.

    NOTE: a read-only SQL query on the store's ``sessions`` table (SessionStore has no listing
    call); WAL mode lets it read while the cluster writes.
    """
    uri = f"file:{store_path}?mode=ro"
    conn = sqlite3.connect(uri, uri=True, timeout=30.0)
    try:
        rows = conn.execute(
            "SELECT id, tenant, user_id, message_count - 1 - summary_until AS pending FROM sessions "
            "WHERE message_count - 1 - summary_until >= ? ORDER BY id",
            (min_unsummarised,),
        ).fetchall()
    finally:
        conn.close()
    return [(r[0], r[1], r[2], int(r[3])) for r in rows]


async def _refresh_all(store_path: Path, todo: list[tuple[str, str, str, int]], summariser: Any, ckpt: Any,
                       progress: bool) -> None:
    from tqdm import tqdm

    from serve.context import ContextManager, SessionStore

    store = SessionStore(store_path)
    try:
        ctx = ContextManager(store, summariser=summariser)
        for session_id, tenant, user, _pending in tqdm(todo, desc=JOB, unit="session", disable=not progress, leave=False):
            session = await store.get(tenant, user, session_id)
            before = session.summary.until_seq
            state = await ctx.refresh_summary(session, force=True)
            if state is None or state.until_seq == before:
                ckpt.add({"seen": 1, "superseded_or_empty": 1})
            else:
                ckpt.add({"seen": 1, "resummarised": 1, "messages_folded": state.until_seq - before})
            # NOTE: counters live in the checkpoint, so a resumed run reports the whole job.
            ckpt.save(0, session_id, finished=False)
    finally:
        store.close()


def resummarise(store_path: Path, *, min_unsummarised: int = 40, summariser: Any = None, dry_run: bool = False,
                checkpoint: Path | None = None, restart: bool = False, progress: bool = True) -> Any:
    """Refresh the summary of every long session; returns a :class:`JobReport`.

    Raises:
        ValueError: ``min_unsummarised`` < 1 or a missing store file (names the option).
    """
    from deployments.jobs._common import Checkpoint, JobReport

    if min_unsummarised < 1:
        raise ValueError(f"min_unsummarised: must be >= 1, got {min_unsummarised}")
    if not store_path.is_file():
        raise ValueError(f"store: {store_path} is not a session store file (no cluster has written sessions there; "
                         "pass --store or the --profile/--config the cluster runs)")
    start = time.monotonic()
    sessions = long_sessions(store_path, min_unsummarised)
    ckpt_path = None if dry_run else (checkpoint or store_path.with_name(store_path.name + ".jobs") / f"{JOB}.json")
    ckpt = Checkpoint(ckpt_path, JOB, {"min_unsummarised": min_unsummarised}, restart=restart)
    after = None if ckpt.done(0) else ckpt.last_id(0)
    todo = [] if ckpt.done(0) else [s for s in sessions if after is None or s[0] > after]
    if dry_run:
        stats = {"sessions": len(todo), "would_fold_messages_at_most": sum(s[3] for s in todo)}
    else:
        asyncio.run(_refresh_all(store_path, todo, summariser, ckpt, progress))
        ckpt.save(0, None, finished=True)
        stats = dict(ckpt.stats)
    return JobReport(job=JOB, dry_run=dry_run, resumed=ckpt.resumed, shards=0, stats=stats,
                     seconds=round(time.monotonic() - start, 3), checkpoint=None if ckpt_path is None else str(ckpt_path))


def _summariser(args: argparse.Namespace) -> Any:
    if args.summariser == "extractive":
        return None  # NOTE: ContextManager's default ExtractiveSummariser
    from deployments.config import load_config
    from deployments.engines import build_engine
    from serve.context import LLMSummariser

    config = load_config(profile=args.profile, path=args.config)
    return LLMSummariser(build_engine(config.summariser.engine))


def default_store(profile: str | None, config_path: Path | None) -> Path:
    """The session store of the cluster that ``profile`` (or the config file) starts:
    ``<state_dir>/sessions.sqlite3``, the file the ``state`` deployment opens."""
    from deployments.config import load_config

    return load_config(profile=profile, path=config_path).state_dir.expanduser().resolve() / "sessions.sqlite3"


def run(args: argparse.Namespace) -> Any:
    """Entry used by both ``recallserve job resummarise`` and ``python -m``."""
    store = args.store or default_store(args.profile, args.config)
    return resummarise(store, min_unsummarised=args.min_unsummarised,
                       summariser=_summariser(args), dry_run=args.dry_run, checkpoint=args.checkpoint,
                       restart=args.restart, progress=not args.no_progress)


def main(argv: list[str] | None = None) -> int:
    from deployments.jobs._args import run_main

    return run_main(add_arguments, run, __doc__.splitlines()[0], argv, common=False)


if __name__ == "__main__":
    sys.exit(main())
