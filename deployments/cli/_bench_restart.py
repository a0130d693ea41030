"""``recallserve bench restart``: shard restart time (snapshot load + WAL replay + BM25 rebuild)."""

from __future__ import annotations

import argparse

from recallserve.deployments.cli._bench_args import (add_out_argument, add_repeats_argument, check_range, parse_size,
                                                     with_progress, write_report)

NAME = "restart"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench restart``."""
    p = subparsers.add_parser(NAME, help="time a memory shard's restart with and without a recent snapshot")
    p.add_argument("--records", default="100k", help="records in the shard (default: 100k)")
    p.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    p.add_argument("--snapshot-every-ops", type=int, default=None,
                   help="snapshot policy to bound (default: ShardConfig.snapshot_every_ops)")
    add_repeats_argument(p, 3, "opens per case; median reported")
    p.add_argument("--workdir", default=None, help="parent of the temporary shard folders (default: system temp)")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Build the three shard folders, time their opens, print the table, write the JSON rows."""
    records = parse_size("records", args.records)
    check_range("dim", args.dim, 1, 8192)
    check_range("repeats", args.repeats, 1, 100)
    if args.snapshot_every_ops is not None:
        check_range("snapshot-every-ops", args.snapshot_every_ops, 1, 10**9)

    from rich.console import Console
    from rich.table import Table

    from recallserve.memory_shards.bench import run_restart_bench

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
    write_report(args, rows)
    return 0
