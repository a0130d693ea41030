"""``recallserve job consolidate``: merge near-duplicate memories of each tenant (keep the newest) (see :mod:`deployments.jobs.consolidate`)."""

from __future__ import annotations

import argparse
import importlib

__all__ = ["add_parser"]

_MODULE = "deployments.jobs.consolidate"


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``job consolidate`` with the same flags as ``python -m deployments.jobs.consolidate``."""
    from deployments.jobs._args import add_common_arguments

    p = subparsers.add_parser("consolidate", help="merge near-duplicate memories of each tenant (keep the newest)")
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
