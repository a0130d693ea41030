"""``recallserve job resummarise``: refresh the rolling summary of long sessions (see
:mod:`deployments.jobs.resummarise`)."""

from __future__ import annotations

import argparse

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``job resummarise`` with the same flags as ``python -m deployments.jobs.resummarise``."""
    from deployments.jobs.resummarise import add_arguments

    p = subparsers.add_parser("resummarise", help="refresh the rolling summary of long sessions (extractive or the summariser model)")
    add_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the job and print its report; errors become one line (exit 2)."""
    from deployments.jobs._args import print_report
    from deployments.jobs.resummarise import run as run_job
    from serve.cli import UserError

    try:
        report = run_job(args)
    except (ValueError, RuntimeError) as exc:
        raise UserError(str(exc)) from None
    print_report(report, args.json)
    return 0
