"""Operator erasure: everything held for one end user, or a whole tenant, with the API's guarantee.

The same :class:`recallserve.serve.erasure.ErasureService` the ``DELETE /v1/users/{user}`` route
runs, over the folders: the memory shards of ``--data-dir`` (every ``shard-<i>``; the cluster must
not hold them: a shard's LOCK refuses it with a clear error) and the SQLite stores of the
profile's ``state_dir``. Logged in the same erasure log (requester ``operator``), resumable (a
second run finishes an interrupted one), and done only when every holder answered.

Run: ``recallserve job erase --tenant acme [--user alice]`` (without ``--user``: the whole tenant).
"""

from __future__ import annotations

import argparse
import asyncio
import sys
import time
from typing import Any

from recallserve.deployments.jobs._args import options_from_args, run_main

__all__ = ["add_arguments", "run", "main"]

JOB = "erase"


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The erasure's own flags."""
    p.add_argument("--tenant", required=True, help="tenant to erase from (the whole tenant without --user)")
    p.add_argument("--user", default=None, help="end user's stored key (the chat request's user; masked as stored)")


def run(args: argparse.Namespace) -> Any:
    """Erase, wait for ``done``, return a :class:`JobReport` with the counts per store."""
    from recallserve.deployments.config import load_config
    from recallserve.deployments.jobs._common import discover_shards
    from recallserve.deployments.jobs._options import JobReport
    from recallserve.memory_shards.coordinator import local_coordinator
    from recallserve.serve.api.auth import RESERVED_TENANT_PREFIX
    from recallserve.serve.context import SessionStore
    from recallserve.serve.erasure import ErasureLog, ErasureService
    from recallserve.serve.experience import ExperienceStore
    from recallserve.serve.traces import TraceStore

    if not args.tenant or args.tenant == "shared" or args.tenant.startswith(RESERVED_TENANT_PREFIX):
        raise ValueError(f"--tenant: {args.tenant!r} is not a tenant that can be erased")
    if args.dry_run:
        raise ValueError("--dry-run: an erasure has no dry run (use GET /v1/users/{user}/export to see what it holds)")
    opts = options_from_args(args)
    state_dir = load_config(profile=args.profile, path=args.config).state_dir
    start = time.perf_counter()
    n = len(discover_shards(opts.data_dir, opts.num_shards))
    coord = local_coordinator(n, opts.model_id, opts.dim, data_root=opts.data_dir)
    stores = {"sessions": SessionStore(state_dir / "sessions.sqlite3"),
              "experiences": ExperienceStore(state_dir / "experiences"),
              "turns": TraceStore(state_dir / "turns.sqlite3")}
    erasures = ErasureLog(state_dir / "erasures.sqlite3")

    async def go() -> Any:
        service = ErasureService(erasures, [coord], stores, retry_s=1.0, max_attempts=3)
        row = await service.request(args.tenant, args.user, "operator")
        await service.wait(row.id)
        return await erasures.get(args.tenant, row.id)

    try:
        row = asyncio.run(go())
    finally:
        for client in coord.shards:
            client.shard.close()
        for store in (*stores.values(), erasures):
            store.close()
    if row is None or row.status != "done":
        raise RuntimeError(f"erasure {getattr(row, 'id', '?')}: {getattr(row, 'error', None) or 'not done'}; run again")
    return JobReport(job=JOB, dry_run=False, resumed=row.attempts > 1, shards=n, stats=row.counts,
                     seconds=time.perf_counter() - start, checkpoint=None,
                     extra={"erasure_id": row.id, "user_hash": row.user_hash})


def main(argv: list[str] | None = None) -> int:
    return run_main(JOB, add_arguments, run, argv)


if __name__ == "__main__":
    sys.exit(main())
