"""``recallserve bench api-search``: latency of ``POST /v1/memories/search`` of the memory API alone, in process.

See :func:`recallserve.serve.bench.api_search_bench`: one tenant of ``--memories`` LoCoMo-derived
memories in hybrid shards, the real memory router behind uvicorn on 127.0.0.1, searches one at a
time. Through a running cluster use ``bench search``.
"""

from __future__ import annotations

import argparse
import json

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import add_out_argument, check_range, write_report

NAME = "api-search"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench api-search``."""
    p = subparsers.add_parser(NAME, help="memory API search latency in process (uvicorn on 127.0.0.1, no Ray)")
    p.add_argument("--locomo", required=True, help="LoCoMo-format JSON: the source of texts and questions")
    p.add_argument("--memories", type=int, default=100_000, help="memories in the tenant (default: 100000)")
    p.add_argument("--queries", type=int, default=200, help="timed searches (default: 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed searches first (default: 20)")
    p.add_argument("--shards", type=int, default=2, help="shards (default: 2)")
    p.add_argument("--k", type=int, default=16, help="results per search (default: 16)")
    p.add_argument("--dense-only", action="store_true", help="hybrid=false in the requests")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load, time the searches, print and write the JSON row."""
    check_range("memories", args.memories, 1, 10_000_000)
    check_range("queries", args.queries, 1, 100_000)
    check_range("warmup", args.warmup, 0, 100_000)
    check_range("shards", args.shards, 1, 64)
    check_range("k", args.k, 1, 1000)

    from recallserve.serve.bench import api_search_bench

    try:
        row = api_search_bench(args.locomo, args.memories, args.queries, args.warmup, args.shards, args.k,
                               hybrid=not args.dense_only)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    print(json.dumps({k: v for k, v in row.items() if k != "shard_stats"}))
    write_report(args, row)
    return 0
