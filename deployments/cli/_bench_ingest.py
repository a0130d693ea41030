"""``recallserve bench ingest``: memories/s of ``POST /v1/memories`` per embedder configuration (JSON row).

In process by default (the memory API alone, several embedder settings interleaved); with
``--url`` through a running cluster instead (:mod:`recallserve.deployments.cli._bench_ingest_cluster`).
"""

from __future__ import annotations

import argparse

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import add_out_argument, write_report
from recallserve.deployments.cli._bench_ingest_cluster import add_cluster_phase_arguments, render, run_cluster
from recallserve.deployments.cli._cluster_client import add_cluster_arguments

NAME = "ingest"


#: the last ``x`` part of a configuration -> (embedder model name, runtime); none = torch fp32.
_MODELS = {
    "fp32": ("all-MiniLM-L6-v2", "torch"),
    "int8": ("all-MiniLM-L6-v2-int8", "torch"),
    "onnx": ("all-MiniLM-L6-v2", "onnx"),
    "onnx-int8": ("all-MiniLM-L6-v2-onnx-int8", "onnx"),
    "wordllama": ("wordllama-l2-supercat-256", "auto"),
}


def _config(text: str) -> tuple[str, int, int, str, str]:
    """``FORWARDxTHREADS[xMODEL]`` -> (label, texts per pass, threads, embedder model name, runtime)."""
    parts = text.strip().split("x", 2)
    kind = parts[2] if len(parts) == 3 else "fp32"
    if kind not in _MODELS:
        raise UserError(f"--configs: {text!r}: MODEL must be one of {', '.join(_MODELS)}")
    try:
        fwd, threads = (int(x) for x in parts[:2])
    except ValueError:
        raise UserError(f"--configs: {text!r} is not FORWARDxTHREADS[xMODEL] (e.g. 16x1 or 16x1xonnx)") from None
    if fwd < 1 or threads < 1:
        raise UserError(f"--configs: {text!r} needs positive numbers")
    return (f"fwd{fwd}-t{threads}" + ("" if kind == "fp32" else f"-{kind}"), fwd, threads, *_MODELS[kind])


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``bench ingest``."""
    p = subparsers.add_parser(NAME, help="memories/s of POST /v1/memories (in-process app, MiniLM, fsync'ed WAL)")
    p.add_argument("--configs", default="16x1,16x1xonnx,16x2xonnx,16x1xonnx-int8,16x2xonnx-int8",
                   help="FORWARDxTHREADS[xMODEL] per configuration, the first is the baseline; MODEL: fp32 (torch, the "
                        "default), int8 (torch int8), onnx (ONNX Runtime fp32, same vectors), onnx-int8, wordllama (static "
                        "word embeddings) "
                        "(default: 16x1,16x1xonnx,16x2xonnx,16x1xonnx-int8,16x2xonnx-int8)")
    p.add_argument("--rounds", type=int, default=8, help="timed batches per configuration (default: 8)")
    p.add_argument("--batch", type=int, default=50, help="memories per request (default: 50)")
    p.add_argument("--locomo", required=True, help="LoCoMo-format JSON: the source of the texts (and of the questions "
                                                   "with --url)")
    add_out_argument(p, NAME, markdown=True)
    cluster = p.add_argument_group("through a running cluster (--url)")
    add_cluster_arguments(cluster, optional=True)
    add_cluster_phase_arguments(cluster)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the benchmark, print a table, write the JSON row and the table beside it."""
    from recallserve.serve.bench import ingest_bench

    if not 1 <= args.batch <= 256 or args.rounds < 1:
        raise UserError("--batch must be in 1..256 and --rounds >= 1")
    command = "recallserve " + " ".join(getattr(args, "argv", []))
    if args.url is not None:
        report = run_cluster(args, command)
        report["label"] = args.label
        table = render([(args.label, report)])
        print(table)
        write_report(args, report, f"# bench ingest --url\n\n`{command}`; load average (1 min) before/after "
                                   f"{report['load_avg_1m_before_after']} on {report['cpus']} CPUs.\n\n{table}")
        return 0
    configs = [_config(c) for c in args.configs.split(",") if c.strip()]
    try:
        row = ingest_bench(configs, rounds=args.rounds, batch=args.batch, locomo=args.locomo)
    except (ValueError, OSError) as exc:
        raise UserError(str(exc)) from None
    row["command"] = command
    table = markdown_table(row)
    print(table)
    write_report(args, row, f"# bench ingest\n\n`{command}`\n\n{row['server']}; batch {row['batch']}, {row['rounds']} "
                            f"rounds; load average (1 min) before/after {row['load_avg_1m_before_after']} on "
                            f"{row['cpus']} CPUs.\n\n{table}\n")
    return 0


def markdown_table(row: dict) -> str:
    """The rows of an ``ingest_bench`` result as a markdown table (ratio vs the first configuration)."""
    lines = ["| config | model | runtime | median s/batch | memories/s | best memories/s | ratio | CPU s/batch | memories/CPU-s "
             "| query embed p50 ms |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for r in row["rows"]:
        # NOTE: .get: JSON rows written before the CPU columns existed render with a dash.
        lines.append(f"| {r['config']} | {r['model']} | {r['runtime']} | {r['median_batch_s']:.3f} | {r['memories_per_s']:.1f} | "
                     f"{r['best_memories_per_s']:.1f} | x{r['ratio_vs_baseline']:.2f} | {r.get('median_cpu_s_per_batch', '-')} | "
                     f"{r.get('memories_per_cpu_s', '-')} | {r['query_embed_p50_ms']} |")
    return "\n".join(lines)
