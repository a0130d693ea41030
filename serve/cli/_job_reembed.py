"""``recallserve job reembed``: re-embed every memory with a new embedder into new shards (switch without downtime) (see :mod:`deployments.jobs.reembed`)."""

from __future__ import annotations

import argparse
import importlib

__all__ = ["add_parser"]

_MODULE = "deployments.jobs.reembed"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``job reembed`` with the same flags as ``python -m deployments.jobs.reembed``."""
    from deployments.jobs._args import add_common_arguments

    p = subparsers.add_parser("reembed", help="re-embed every memory with a new embedder into new shards (switch without downtime)")
    add_common_arguments(p)
    _add_job_arguments(p)
    p.set_defaults(func=run)


def _add_job_arguments(p: argparse.ArgumentParser) -> None:
    # NOTE: the job module is light at import (heavy imports live inside its functions).
    importlib.import_module(_MODULE).add_arguments(p)


def run(args: argparse.Namespace) -> int:
    """Run the job and print its report; errors become one line (exit 2)."""
    from deployments.jobs._args import print_report
    from serve.cli import UserError

    try:
        report = importlib.import_module(_MODULE).run(args)
    except (ValueError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    print_report(report, args.json)
    return 0
