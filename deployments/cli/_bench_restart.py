"""``recallserve bench restart``: shard restart time (snapshot load + WAL replay + BM25 rebuild)."""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_memory import _parse_size, with_progress

NAME = "restart"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench restart``."""
    p = subparsers.add_parser(NAME, help="time a memory shard's restart with and without a recent snapshot")
    p.add_argument("--records", default="100k", help="records in the shard (default: 100k)")
    p.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    p.add_argument("--snapshot-every-ops", type=int, default=None,
                   help="snapshot policy to bound (default: ShardConfig.snapshot_every_ops)")
    p.add_argument("--repeats", type=int, default=3, help="opens per case; median reported (default: 3)")
    p.add_argument("--workdir", default=None, help="parent of the temporary shard folders (default: system temp)")
    p.add_argument("--out", default=None, help="JSON output (default: bench-results/restart-<timestamp>.json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the three shard folders, time their opens, print the table, write the JSON rows."""
    records = _parse_size(args.records)
    for name in ("dim", "repeats"):
        if getattr(args, name) < 1:
            raise UserError(f"--{name}: must be >= 1, got {getattr(args, name)}")
    if args.snapshot_every_ops is not None and args.snapshot_every_ops < 1:
        raise UserError(f"--snapshot-every-ops: must be >= 1, got {args.snapshot_every_ops}")
    out = Path(args.out or f"bench-results/restart-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")

    from rich.console import Console
    from rich.table import Table

    from recallserve.memory_shards.restart_bench import run_restart_bench

    console = Console()
    rows = with_progress(console, lambda progress: run_restart_bench(
        records, args.dim, args.snapshot_every_ops, args.repeats, workdir=args.workdir, progress=progress))
    table = Table(title=f"shard restart at {records:,} records, dim {args.dim} (median of {args.repeats})")
    for col in ("case", "WAL entries replayed", "open s (snapshot + WAL)", "BM25 rebuild s", "restart s"):
        table.add_column(col, justify="left" if col == "case" else "right")
    for r in rows:
        table.add_row(r["case"], f"{r['wal_tail_entries']:,}", f"{r['open_s']:.2f}", f"{r['bm25_rebuild_s']:.2f}",
                      f"{r['restart_s']:.2f}")
    console.print(table)
    console.print(f"snapshot write at {records:,} records: {rows[0]['snapshot_write_s']:.2f} s "
                  f"(policy: every {rows[0]['snapshot_every_ops']:,} WAL entries)")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(rows, indent=1), encoding="utf-8")
    console.print(f"wrote {len(rows)} rows to {out}")
    return 0
