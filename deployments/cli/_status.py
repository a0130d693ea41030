"""``recallserve status [--json]``: every node and every Serve replica of a running cluster."""

from __future__ import annotations

import argparse
import json

from recallserve.deployments.cli import UserError, add_profile_arguments, add_ray_address_argument, load_profile_config

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``status``."""
    p = subparsers.add_parser(
        "status", help="list the nodes (id, head/worker, raylet PID, alive) and replicas (deployment, node, PID) of a running cluster")
    add_profile_arguments(p)
    add_ray_address_argument(p)
    p.add_argument("--json", action="store_true", help="print one JSON object {nodes: [...], replicas: [...]}")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Connect, read the GCS tables, print them."""
    config = load_profile_config(args)
    from recallserve.deployments.cluster_status import cluster_status, render_status
    from recallserve.deployments.jobs import JobError
    from recallserve.deployments.jobs._live import ray_connection

    try:
        with ray_connection(args.ray_address or config.ray.address, config.ray.temp_dir, config.ray.auth_disabled):
            status = cluster_status()
    except JobError as exc:
        raise UserError(str(exc)) from None
    print(json.dumps(status, indent=2) if args.json else render_status(status))
    return 0
