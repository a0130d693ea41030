"""``recallserve deploy``: update the app of a running cluster in place to a new config."""

from __future__ import annotations

import argparse

from recallserve.deployments.cli import UserError, add_profile_arguments, add_ray_address_argument, load_profile_config

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``deploy``."""
    p = subparsers.add_parser(
        "deploy",
        help="roll a running cluster (recallserve up, or --ray-address) to a new profile/config without stopping it",
    )

    add_profile_arguments(p)
    add_ray_address_argument(p)
    p.add_argument("--timeout", type=float, default=600.0, help="seconds to wait for the app to run again")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Validate the config, roll the app, print how long it took."""
    config = load_profile_config(args)
    from recallserve.deployments.runner import redeploy

    try:
        seconds = redeploy(config, address=args.ray_address, timeout_s=args.timeout)
    except (RuntimeError, TimeoutError) as exc:
        raise UserError(str(exc)) from None
    m = config.memory.migration
    phase = "" if m is None else f" (memory migration to {m.generation!r}: reads {m.reads}, writes {m.writes})"
    print(f"recallserve: app {config.name!r} rolled to the new config in {seconds:.1f} s{phase}")
    return 0
