"""``recallserve bench verify``: ordinary requests of one ingress replica while hostile experience records are posted.

See :func:`recallserve.serve.bench.verify_bench`. Prints a table of the p50 / p95 of each run and
their ratio to "alone", and writes it beside the JSON figures.
"""

from __future__ import annotations

import argparse
import time

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import add_out_argument, write_report

NAME = "verify"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench verify``."""
    p = subparsers.add_parser(NAME, help="request latency of one ingress while hostile experience records are verified")
    p.add_argument("--probes", type=int, default=300, help="ordinary requests per run, >= 20 (default: 300)")
    p.add_argument("--posters", type=int, default=4, help="concurrent clients posting hostile records, >= 1 (default: 4)")
    add_out_argument(p, NAME, markdown=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Time the five runs, print and write the table."""
    from recallserve.deployments.engines import RemoteConfig, build_engine
    from recallserve.serve.bench import verify_bench

    # NOTE: never called: the routes timed here do not reach the engine (nothing listens on port 9).
    engine = build_engine(RemoteConfig(base_url="http://127.0.0.1:9/v1", model="bench"))
    try:
        results = verify_bench(engine, args.probes, args.posters)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    base = results["alone"]
    lines = [f"# Ordinary requests while hostile verification records are posted "
             f"({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})", "",
             f"{args.probes} sequential GET /healthz and /v1/models; clients (`posters`) posting a 32-check "
             "hostile record without pause; one in-process app (one event loop, as one ingress replica).", "",
             "| run | posters | p50 | p95 | p50 / alone | hostile posts | hostile post p50 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        post = f"{r['hostile_post_p50_ms']:.1f} ms" if "hostile_post_p50_ms" in r else "-"
        lines.append(f"| {name} | {r['posters']:.0f} | {r['p50_ms']:.2f} ms | {r['p95_ms']:.2f} ms "
                     f"| {r['p50_ms'] / base['p50_ms']:.2f}x | {r['hostile_posts']:.0f} | {post} |")
    table = "\n".join(lines) + "\n"
    print(table)
    write_report(args, {"probes": args.probes, "posters": args.posters, **results}, table)
    return 0
