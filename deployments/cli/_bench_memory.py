"""``recallserve bench memory``: naive vs FAISS+numpy vs fused retrieval (table + JSON rows)."""

from __future__ import annotations

import argparse

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import (add_out_argument, add_repeats_argument, check_range, parse_ints,
                                                     with_progress, write_report)

NAME = "memory"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench memory``."""
    p = subparsers.add_parser(NAME, help="compare naive, FAISS+numpy and fused memory retrieval")
    p.add_argument("--sizes", default="200k,1M", help="comma-separated row counts (default: 200k,1M)")
    p.add_argument("--dim", type=int, default=384, help="vector dimension (default: 384)")
    p.add_argument("--queries", type=int, default=64, help="queries per batch (default: 64)")
    p.add_argument("--k", type=int, default=20, help="results per query (default: 20)")
    add_repeats_argument(p, 3, "timed runs per method; median reported")
    p.add_argument("--seed", type=int, default=0, help="data seed (default: 0)")
    p.add_argument("--backend", choices=["torch", "triton", "auto"], default="auto",
                   help="fused kernel backend (triton: compiled, CUDA only; auto: triton on CUDA, else torch)")
    p.add_argument("--device", default=None, choices=["cpu", "cuda"],
                   help="where the fused path's columns live (default: cuda for auto/triton when present, else cpu)")
    p.add_argument("--vector-dtype", default="float32", choices=["float32", "float16", "bfloat16"],
                   help="storage of the fused path's vectors (products and sums stay float32)")
    p.add_argument("--threads", type=int, default=None,
                   help="CPU threads of torch and FAISS (default: torch's); 1 is steadier on a loaded shared machine")
    p.add_argument("--target-recall", type=float, default=0.99,
                   help="recall the calibrated baselines are oversampled to (default: 0.99)")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print the table, write the JSON rows."""
    sizes = parse_ints("sizes", args.sizes, 1_000, 100_000_000, size=True)
    for name in ("dim", "queries", "k", "repeats"):
        check_range(name, getattr(args, name), 1, 1_000_000)
    check_range("target-recall", args.target_recall, 1e-9, 1.0)

    from rich.console import Console
    from rich.table import Table

    from recallserve.memory_shards.bench import run_memory_bench

    console = Console()
    try:
        rows = with_progress(console, lambda progress: run_memory_bench(
            sizes, args.dim, args.queries, args.k, args.repeats, args.seed, args.backend, progress,
            device=args.device, vector_dtype=args.vector_dtype, target_recall=args.target_recall,
            threads=args.threads))
    except ValueError as exc:
        # NOTE: e.g. --backend triton or --device cuda on a machine without CUDA: a message, not a traceback.
        raise UserError(f"--{exc}") from None
    table = Table(title=f"memory retrieval: {args.queries} queries x top-{args.k}, dim {args.dim}")
    for col in ("rows", "method", "device", "ms / batch (median)", "vs baseline", "ms (min)", "recall", "oversample",
                "results/query", "GB/s (share of peak)"):
        table.add_column(col, justify="right" if col not in ("method", "device") else "left")
    for r in rows:
        bw = f"{r['gbps']:.0f} ({r['fraction_of_peak'] or 0:.0%})" if "gbps" in r else ""
        table.add_row(f"{r['size']:,}", r["method"], r["device"], f"{r['ms_per_batch']:.1f}",
                      f"{r['speedup_vs_naive']:.2f}x vs {r['baseline']}", f"{r['ms_min']:.1f}", f"{r['recall']:.4f}",
                      str(r.get("oversample", "")), f"{r['mean_results']:.1f} / {r['mean_truth_results']:.1f}", bw)
    for r in rows:
        if "speedup_vs_best_baseline" in r:
            console.print(f"{r['size']:,} rows: fused {r['speedup_vs_best_baseline']:.2f}x the fastest baseline with "
                          f"recall >= {args.target_recall} ({r['best_baseline']})")
    console.print(table)
    write_report(args, rows)
    return 0
