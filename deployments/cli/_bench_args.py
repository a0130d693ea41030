"""What every ``recallserve bench`` subcommand shares: the arguments named alike and the report files.

A bench registers its own arguments with these helpers so that ``--out``, ``--seconds``,
``--repeats``, sizes (``200k``, ``1M``) and lists (``1,16,64``) read, check and fail the same way
in every subcommand: a bad value is one :class:`~recallserve.deployments.cli.UserError` line
naming the flag. A cluster's ``--url`` / ``--key`` come from
:func:`recallserve.deployments.cli._cluster_client.add_cluster_arguments`.

Reports are data (JSON, with a Markdown table beside it where the bench prints one): by default
``bench-results/<name>-<UTC time>.json``; ``--out loadtests/results/<name>.json`` refreshes the
committed figures.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

from recallserve.deployments.cli import UserError

__all__ = ["add_out_argument", "add_repeats_argument", "add_seconds_argument", "check_range", "parse_ints",
           "parse_size", "with_progress", "write_report"]

T = TypeVar("T")


def add_out_argument(p: argparse.ArgumentParser, name: str, markdown: bool = False) -> None:
    """``--out PATH``: the JSON report (default ``bench-results/<name>-<UTC time>.json``)."""
    beside = "; a Markdown table goes beside it (.md)" if markdown else ""
    p.add_argument("--out", type=Path, default=None,
                   help=f"JSON report (default: bench-results/{name}-<UTC time>.json){beside}")
    p.set_defaults(bench_name=name)


def add_seconds_argument(p: argparse.ArgumentParser, default: float, what: str) -> None:
    """``--seconds S``: how long each measured phase runs (``what`` names the phase)."""
    p.add_argument("--seconds", type=float, default=default, help=f"seconds {what} (default: {default:g})")


def add_repeats_argument(p: argparse.ArgumentParser, default: int, what: str) -> None:
    """``--repeats N``: timed runs (``what`` says of what and which statistic is reported)."""
    p.add_argument("--repeats", type=int, default=default, help=f"{what} (default: {default})")


def check_range(flag: str, value: float, lo: float, hi: float) -> None:
    """Raise a :class:`UserError` naming ``--flag`` unless ``lo <= value <= hi``."""
    if not lo <= value <= hi:
        raise UserError(f"--{flag}: must be within [{lo:g}, {hi:g}], got {value:g}")


def parse_size(flag: str, text: str, minimum: int = 1_000) -> int:
    """``200k`` / ``1M`` / ``50000`` -> rows; at least ``minimum``."""
    raw = text.strip().lower()
    mult = 1
    if raw.endswith("k"):
        mult, raw = 1_000, raw[:-1]
    elif raw.endswith("m"):
        mult, raw = 1_000_000, raw[:-1]
    try:
        value = int(float(raw) * mult)
    except ValueError:
        raise UserError(f"--{flag}: {text!r} is not a size (e.g. 200k, 1M, 50000)") from None
    if value < minimum:
        raise UserError(f"--{flag}: {value} is below the minimum of {minimum} rows")
    return value


def parse_ints(flag: str, text: str, lo: int, hi: int, size: bool = False) -> list[int]:
    """``1,16,64`` -> ``[1, 16, 64]``, each within ``[lo, hi]``; ``size``: items may be ``200k`` / ``1M``."""
    items = [t for t in text.split(",") if t.strip()]
    try:
        values = [parse_size(flag, t, lo) if size else int(t) for t in items]
    except ValueError:
        raise UserError(f"--{flag}: {text!r} is not a comma-separated list of integers (e.g. 1,16,64)") from None
    if not values or not all(lo <= v <= hi for v in values):
        raise UserError(f"--{flag}: each value must be within [{lo}, {hi}], got {text!r}")
    return values


def with_progress(console: Any, work: Callable[[Callable[[str, float | None], None]], T]) -> T:
    """Run ``work(progress)`` under a transient rich progress bar; ``progress(message, fraction or None)``."""
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    with Progress(TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn(), console=console,
                  transient=True) as bar:
        task = bar.add_task("starting", total=1.0)

        def progress(msg: str, frac: float | None) -> None:
            bar.update(task, description=msg, completed=frac if frac is not None else 0.0,
                       total=1.0 if frac is not None else None)

        return work(progress)


def write_report(args: argparse.Namespace, data: Any, markdown: str | None = None) -> Path:
    """Write ``data`` as JSON to ``args.out`` (default under ``bench-results/``), ``markdown`` beside it as ``.md``.

    The report records the command that made it when ``data`` is a dict without one. Returns the
    JSON path.
    """
    name = getattr(args, "bench_name", "bench")
    path = Path(args.out) if args.out is not None else (
        Path("bench-results") / time.strftime(f"{name}-%Y%m%dT%H%M%SZ.json", time.gmtime()))
    # NOTE: "--out results/x" and "--out results/x.json" name the same report; a dot inside a name
    # ("model-1.5b") is kept.
    path = path.with_suffix(".json") if path.suffix in (".json", ".md") else path.with_name(path.name + ".json")
    if isinstance(data, dict):
        data.setdefault("command", "recallserve " + " ".join(getattr(args, "argv", [])))
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=1, default=str) + "\n", encoding="utf-8")
    if markdown is not None:
        path.with_suffix(".md").write_text(markdown, encoding="utf-8")
    print(f"wrote {path}" + (f" and {path.with_suffix('.md')}" if markdown is not None else ""))
    return path
