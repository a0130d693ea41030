"""``recallserve bench scan-layout``: a shard's search over row-major vs column-major vectors, in process.

See :mod:`recallserve.memory_shards.bench.scan_layout`; prints and writes a Markdown table beside
the JSON rows.
"""

from __future__ import annotations

import argparse

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import (add_out_argument, add_repeats_argument, check_range, parse_ints,
                                                     with_progress, write_report)

NAME = "scan-layout"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench scan-layout``."""
    p = subparsers.add_parser(NAME, help="shard search over row-major vs column-major vectors")
    p.add_argument("--rows", default="2000,20000,100000,200000",
                   help="comma-separated shard sizes, 1000-1000000 (default: 2000,20000,100000,200000)")
    p.add_argument("--queries", default="1,16,64", help="comma-separated queries per dense call, 1-256 (default: 1,16,64)")
    add_repeats_argument(p, 0, "timed calls per layout, 0-1000 (0: 40 below 50k rows, else 12)")
    p.add_argument("--distinct", type=int, default=200, help="base texts embedded for the rows, 50-5000 (default: 200)")
    p.add_argument("--threads", type=int, default=1, help="torch threads, 1-64 (default: 1, the shard replica's)")
    add_out_argument(p, NAME, markdown=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Measure both layouts, print the table, write JSON and Markdown."""
    sizes = parse_ints("rows", args.rows, 1000, 1_000_000, size=True)
    counts = parse_ints("queries", args.queries, 1, 256)
    check_range("repeats", args.repeats, 0, 1000)
    check_range("distinct", args.distinct, 50, 5000)
    check_range("threads", args.threads, 1, 64)

    from rich.console import Console

    from recallserve.memory_shards.bench.scan_layout import render, run_scan_layout_bench

    console = Console()
    try:
        rows = with_progress(console, lambda progress: run_scan_layout_bench(
            sizes, counts, args.repeats, args.distinct, args.threads, progress=progress))
    except (ValueError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    table = render(rows)
    console.print(table)
    write_report(args, {"threads": args.threads, "rows": rows}, table)
    return 0
