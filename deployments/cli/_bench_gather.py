"""``recallserve bench gather``: shard searches under concurrency, each alone vs gathered into one scan."""

from __future__ import annotations

import argparse
import time
from pathlib import Path

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_memory import _parse_size, print_and_write, with_progress

NAME = "gather"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench gather``."""
    p = subparsers.add_parser(NAME, help="throughput and p95 of one shard at 1/16/64 concurrent searches, alone vs gathered")
    p.add_argument("--rows", default="100k", help="rows in the shard (default: 100k)")
    p.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    p.add_argument("--clients", default="1,16,64", help="comma-separated concurrency levels (default: 1,16,64)")
    p.add_argument("--seconds", type=float, default=5.0, help="closed-loop load per level and mode (default: 5)")
    p.add_argument("--out", default=None, help="JSON output (default: bench-results/gather-<timestamp>.json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run both modes, print the table, write the JSON rows."""
    rows = _parse_size(args.rows)
    try:
        clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        raise UserError(f"--clients: {args.clients!r} is not a list of integers (e.g. 1,16,64)") from None
    if not clients or min(clients) < 1 or max(clients) > 1024:
        raise UserError(f"--clients: each level must be in 1..1024, got {args.clients!r}")
    if not 0.5 <= args.seconds <= 600:
        raise UserError(f"--seconds: must be in 0.5..600, got {args.seconds}")
    if not 1 <= args.dim <= 8192:
        raise UserError(f"--dim: must be in 1..8192, got {args.dim}")
    out = Path(args.out or f"bench-results/gather-{time.strftime('%Y%m%dT%H%M%SZ', time.gmtime())}.json")

    from rich.console import Console
    from rich.table import Table

    from recallserve.memory_shards.gather_bench import run_gather_bench

    console = Console()
    result = with_progress(console, lambda progress: run_gather_bench(rows, args.dim, clients, args.seconds, progress=progress))
    table = Table(title=f"one shard, {rows:,} rows x {args.dim}: one-query searches in a closed loop")
    for col in ("mode", "clients", "answers/s", "p50 ms", "p95 ms", "queries/scan"):
        table.add_column(col, justify="left" if col == "mode" else "right")
    for r in result:
        table.add_row(r["mode"], str(r["clients"]), f"{r['throughput_rps']:.1f}", f"{r['p50_ms']:.1f}", f"{r['p95_ms']:.1f}",
                      f"{r['queries_per_scan']:.1f}")
    return print_and_write(console, table, result, out)
