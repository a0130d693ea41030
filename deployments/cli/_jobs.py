"""``recallserve job NAME``: the batch jobs of :data:`recallserve.deployments.jobs.JOBS`, one parser each.

Each job module exposes ``add_arguments(parser)`` and ``run(args) -> report``, and runs the same
way as ``python -m recallserve.deployments.jobs.<module>`` (so also under ``ray job submit``).
"""

from __future__ import annotations

import argparse
import importlib

from recallserve.deployments.cli import UserError
from recallserve.deployments.jobs import JOBS
from recallserve.deployments.jobs._args import add_common_arguments, print_report

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register every job under ``recallserve job``."""
    for name, spec in JOBS.items():
        p = subparsers.add_parser(name, help=spec.help)
        if spec.shard_flags:
            add_common_arguments(p)
        # NOTE: job modules are light at import (heavy imports live inside their functions).
        importlib.import_module(spec.module).add_arguments(p)
        p.set_defaults(func=_runner(spec.module))


def _runner(module: str):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        """Run the job and print its report; errors become one line (exit 2)."""
        try:
            report = importlib.import_module(module).run(args)
        except (ValueError, RuntimeError) as exc:
            raise UserError(str(exc)) from None
        print_report(report, args.json)
        return 0

    return run
