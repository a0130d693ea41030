"""``recallserve bench search-cost``: CPU ms of each piece of one memory search, in process (no Ray).

See :mod:`recallserve.memory_shards.bench.search_cost`: query embedding alone and batched, one
shard's hybrid and dense search per size, and the pickled answer's size and cost.
"""

from __future__ import annotations

import argparse
import json

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import (add_out_argument, add_repeats_argument, check_range, parse_ints,
                                                     write_report)

NAME = "search-cost"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench search-cost``."""
    p = subparsers.add_parser(NAME, help="CPU ms of embedding, shard search and pickling of one search")
    p.add_argument("--rows", default="2000,100000", help="comma-separated shard sizes, 1000-1000000 (default: 2000,100000)")
    p.add_argument("--distinct", type=int, default=200, help="base texts embedded for the rows, 50-5000 (default: 200)")
    add_repeats_argument(p, 20, "timed calls per figure, 1-1000; mean reported")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Measure, print the figures, write them as JSON."""
    sizes = parse_ints("rows", args.rows, 1000, 1_000_000, size=True)
    check_range("distinct", args.distinct, 50, 5000)
    check_range("repeats", args.repeats, 1, 1000)

    from recallserve.memory_shards.bench import run_search_cost

    try:
        figures = run_search_cost(sizes, args.distinct, args.repeats)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(figures, indent=2))
    write_report(args, {"rows": sizes, "distinct": args.distinct, "repeats": args.repeats, "cpu_ms": figures})
    return 0
