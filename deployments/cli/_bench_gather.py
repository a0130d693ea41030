"""``recallserve bench gather``: shard searches under concurrency, each alone vs gathered into one scan."""

from __future__ import annotations

import argparse

from recallserve.deployments.cli._bench_args import (add_out_argument, add_seconds_argument, check_range, parse_ints,
                                                     parse_size, with_progress, write_report)

NAME = "gather"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench gather``."""
    p = subparsers.add_parser(NAME, help="throughput and p95 of one shard at 1/16/64 concurrent searches, alone vs gathered")
    p.add_argument("--rows", default="100k", help="rows in the shard (default: 100k)")
    p.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    p.add_argument("--clients", default="1,16,64", help="comma-separated concurrency levels (default: 1,16,64)")
    add_seconds_argument(p, 5.0, "of closed-loop load per level and mode")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run both modes, print the table, write the JSON rows."""
    rows = parse_size("rows", args.rows)
    clients = parse_ints("clients", args.clients, 1, 1024)
    check_range("seconds", args.seconds, 0.5, 600)
    check_range("dim", args.dim, 1, 8192)

    from rich.console import Console
    from rich.table import Table

    from recallserve.memory_shards.bench import run_gather_bench

    console = Console()
    result = with_progress(console, lambda progress: run_gather_bench(rows, args.dim, clients, args.seconds, progress=progress))
    table = Table(title=f"one shard, {rows:,} rows x {args.dim}: one-query searches in a closed loop")
    for col in ("mode", "clients", "answers/s", "p50 ms", "p95 ms", "queries/scan"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for r in result:
        table.add_row(r["mode"], str(r["clients"]), f"{r['throughput_rps']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                      f"{r['queries_per_scan']:.1f}")
    console.print(table)
    write_report(args, result)
    return 0
