"""``recallserve bench kernels``: the fused scoring kernel, torch reference vs compiled Triton (CUDA), one block.

The rows of :func:`recallserve.kernels.bench.bench_kernels`: per implementation the median and
min ms, GB/s of the scan, and on CUDA the share of the device's datasheet bandwidth.
"""

from __future__ import annotations

import argparse

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import (add_out_argument, add_repeats_argument, check_range, parse_size,
                                                     write_report)

NAME = "kernels"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench kernels``."""
    p = subparsers.add_parser(NAME, help="fused scoring kernel: torch reference vs Triton (CUDA), GB/s")
    p.add_argument("--rows", default="200k", help="rows in the block (default: 200k)")
    p.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    p.add_argument("--queries", type=int, default=64, help="queries per call (default: 64)")
    p.add_argument("--k", type=int, default=20, help="results per query (default: 20)")
    p.add_argument("--dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="storage of the vectors; queries stay float32 (default: float32)")
    p.add_argument("--threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    add_repeats_argument(p, 10, "timed calls per implementation after one warm-up; median reported")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Time each implementation, print one line each, write the JSON rows."""
    rows = parse_size("rows", args.rows, 1)
    check_range("dim", args.dim, 1, 8192)
    check_range("queries", args.queries, 1, 4096)
    check_range("k", args.k, 1, 4096)
    check_range("repeats", args.repeats, 1, 1000)
    if args.threads is not None:
        check_range("threads", args.threads, 1, 1024)

    from recallserve.kernels.bench import bench_kernels

    try:
        result = bench_kernels(rows, args.dim, args.queries, args.k, args.repeats, threads=args.threads, dtype=args.dtype)
    except ValueError as exc:
        raise UserError(str(exc)) from None
    for r in result:
        share = f", {r['fraction_of_peak']:.0%} of {r['peak_gbps']:.0f} GB/s" if r.get("fraction_of_peak") else ""
        speed = f", {r['speedup_vs_torch']}x torch" if "speedup_vs_torch" in r else ""
        print(f"{r['impl']:12s} {r['dtype']:8s} {rows:,} x {args.dim}, {args.queries} queries: "
              f"{r['ms_median']:.3f} ms, {r['gbps']:.1f} GB/s{share}{speed}")
    write_report(args, result)
    return 0
