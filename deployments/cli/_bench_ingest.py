"""``recallserve bench ingest``: memories/s of ``POST /v1/memories`` per embedder configuration (JSON row)."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from deployments.cli import UserError

NAME = "ingest"


def _config(text: str) -> tuple[str, int, int, bool]:
    parts = text.strip().split("x")
    quantized = parts[-1] == "int8"
    if quantized:
        parts = parts[:-1]
    try:
        fwd, threads = (int(x) for x in parts)
    except ValueError:
        raise UserError(f"--configs: {text!r} is not FORWARDxTHREADS[xint8] (e.g. 16x1 or 16x1xint8)") from None
    if fwd < 1 or threads < 1:
        raise UserError(f"--configs: {text!r} needs positive numbers")
    return (f"fwd{fwd}-t{threads}" + ("-int8" if quantized else ""), fwd, threads, quantized)


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench ingest``."""
    p = subparsers.add_parser(NAME, help="memories/s of POST /v1/memories (in-process app, MiniLM, fsync'ed WAL)")
    p.add_argument("--configs", default="64x1,16x1,16x2",
                   help="FORWARDxTHREADS[xint8] per configuration, the first is the baseline (default: 64x1,16x1,16x2; "
                        "64x1 was the default before; xint8 = the all-MiniLM-L6-v2-int8 embedder)")
    p.add_argument("--rounds", type=int, default=8, help="timed batches per configuration (default: 8)")
    p.add_argument("--batch", type=int, default=50, help="memories per request (default: 50)")
    p.add_argument("--locomo", default="../shared/eval/locomo_dev.json", help="source of the texts")
    p.add_argument("--out", type=Path, default=Path("loadtests/results/memory-ingest-cpu-local.json"), help="JSON output")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print a table, write the JSON row."""
    import sys

    from serve.memory_api._bench import ingest_bench

    if not 1 <= args.batch <= 256 or args.rounds < 1:
        raise UserError("--batch must be in 1..256 and --rounds >= 1")
    configs = [_config(c) for c in args.configs.split(",") if c.strip()]
    try:
        row = ingest_bench(configs, rounds=args.rounds, batch=args.batch, locomo=args.locomo)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    row["command"] = " ".join(["recallserve", *sys.argv[1:]])
    for r in row["rows"]:
        print(f"{r['config']:>12}  median {r['median_batch_s']:.3f} s/batch  {r['memories_per_s']:7.1f} mem/s  "
              f"(best {r['best_memories_per_s']:.1f})  x{r['ratio_vs_baseline']:.2f}")
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(row, indent=2) + "\n")
    print(f"wrote {args.out}")
    return 0
