"""``recallserve job NAME``: the batch jobs of ``deployments.jobs``, one parser each.

Each job module exposes ``add_arguments(parser)`` and ``run(args) -> report``, and runs the same
way as ``python -m deployments.jobs.<module>`` (so also under ``ray job submit``).
"""

from __future__ import annotations

import argparse
import importlib

__all__ = ["JOBS", "add_parser"]

# name -> (module, help, takes the shared --data-dir/--checkpoint/... flags)
JOBS: dict[str, tuple[str, str, bool]] = {
    "expiry-sweep": ("deployments.jobs.expiry_sweep",
                     "delete expired memories and demote decayed ones to the archival tier", True),
    "reembed": ("deployments.jobs.reembed",
                "re-embed every memory with a new embedder into new shards (switch without downtime)", True),
    "consolidate": ("deployments.jobs.consolidate",
                    "merge near-duplicate memories of each tenant (keep the newest)", True),
    "resummarise": ("deployments.jobs.resummarise",
                    "refresh the rolling summary of long sessions (extractive or the summariser model)", False),
}


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register every job under ``recallserve job``."""
    from deployments.jobs._args import add_common_arguments

    for name, (module, help_text, common) in JOBS.items():
        p = subparsers.add_parser(name, help=help_text)
        if common:
            add_common_arguments(p)
        # NOTE: job modules are light at import (heavy imports live inside their functions).
        importlib.import_module(module).add_arguments(p)
        p.set_defaults(func=_runner(module))


def _runner(module: str):  # type: ignore[no-untyped-def]
    def run(args: argparse.Namespace) -> int:
        """Run the job and print its report; errors become one line (exit 2)."""
        from deployments.jobs._args import print_report
        from serve.cli import UserError

        try:
            report = importlib.import_module(module).run(args)
        except (ValueError, RuntimeError) as exc:
            raise UserError(str(exc)) from None
        print_report(report, args.json)
        return 0

    return run
