"""The shared frame of the in-process benchmarks: a parser with ``--out``, and the report files.

Each benchmark prints a Markdown table and keeps it, with the raw figures as JSON, beside the
other load-test results (``loadtests/results/<name>.{md,json}``): benchmarks are data.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Any

__all__ = ["bench_parser", "write_report"]


def bench_parser(prog: str, doc: str, name: str) -> argparse.ArgumentParser:
    """A parser for ``python -m loadtests.<prog>`` with ``--out`` defaulting to ``loadtests/results/<name>``."""
    p = argparse.ArgumentParser(prog=f"python -m loadtests.{prog}", description=doc.split("\n")[0])
    p.add_argument("--out", type=Path, default=Path("loadtests/results") / name,
                   help="report path without suffix (.md and .json are written)")
    return p


def write_report(out: Path, text: str, data: dict[str, Any]) -> None:
    """Print ``text`` and write it to ``out.md``, and ``data`` to ``out.json``."""
    print(text)
    out.parent.mkdir(parents=True, exist_ok=True)
    out.with_suffix(".md").write_text(text)
    out.with_suffix(".json").write_text(json.dumps(data, indent=2) + "\n")
