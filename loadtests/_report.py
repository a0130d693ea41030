"""The shared frame of the in-process benchmarks: a parser with ``--out``, and the report files.

Each benchmark prints a Markdown table and keeps it, with the raw figures as JSON, beside the
other load-test results (``loadtests/results/<name>.{md,json}``): benchmarks are data.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["bench_parser", "check_bounds", "cluster_run_parser", "write_report"]


def bench_parser(prog: str, doc: str, name: str) -> argparse.ArgumentParser:
    """A parser for ``python -m loadtests.<prog>`` with ``--out`` defaulting to ``loadtests/results/<name>``."""
    p = argparse.ArgumentParser(prog=f"python -m loadtests.{prog}", description=doc.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("loadtests/results") / name,
                   help="report path without suffix (.md and .json are written)")
    return p


def cluster_run_parser(prog: str, doc: str, name: str) -> argparse.ArgumentParser:
    """:func:`bench_parser` of a run that starts its own cluster: ``--profile`` and ``--model`` too."""
    p = bench_parser(prog, doc, name)
    p.add_argument("--profile", default="cpu-local", help="profile to start (default cpu-local)")
    p.add_argument("--model", default="smollm2-135m-instruct-q4_1", help="chat model of the three roles")
    return p


def check_bounds(p: argparse.ArgumentParser, args: argparse.Namespace,
                 bounds: list[tuple[str, float, float]]) -> argparse.Namespace:
    """``args`` when each named value lies within its ``[lo, hi]``; else ``p.error`` naming the option."""
    for name, lo, hi in bounds:
        if not lo <= getattr(args, name) <= hi:
            p.error(f"--{name.replace('_', '-')} must be within [{lo}, {hi}], got {getattr(args, name)}")
    return args


def write_report(out: Path, text: str, data: dict[str, Any]) -> None:
    """Print ``text`` and write it to ``out.md``, and ``data`` to ``out.json``."""
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
