"""The ``recallserve`` console script: ``recallserve up|deploy|models|serve-config|demo|bench|eval|job ...``.

Each leaf command lives in its own module exposing ``add_parser(subparsers)``; heavy imports
(torch, ray, llama.cpp) happen inside the command's handler so ``--help`` stays fast.
Errors a user can fix (:class:`UserError`) print one clear line and exit 2, not a traceback.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence
from pathlib import Path

__all__ = ["COMMANDS", "UserError", "add_profile_arguments", "add_ray_address_argument", "load_profile_config", "main"]

class UserError(Exception):
    """An error caused by the user's input or environment; printed as one line."""


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    """``--profile NAME | --config FILE`` (exclusive): which cluster config a command works on."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", default=None, help="built-in profile name (default: cpu-local)")
    src.add_argument("--config", type=Path, default=None, help="a profile YAML file instead of a built-in profile")


def add_ray_address_argument(p: argparse.ArgumentParser) -> None:
    """``--ray-address``: the running cluster a command connects to."""
    p.add_argument("--ray-address", default=None,
                   help="Ray address (default: $RAY_ADDRESS, else the local cluster using the profile's ray.temp_dir)")


def load_profile_config(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    """The config :func:`add_profile_arguments` named; a bad profile or file is a :class:`UserError`.

    NOTE: the config module is imported here, not at the top, so ``--help`` stays fast (module docstring).
    """
    from recallserve.deployments.config import ConfigError, load_config

    try:
        return load_config(profile=args.profile, path=args.config)
    except ConfigError as exc:
        raise UserError(str(exc)) from None


# NOTE: the one list of commands; its order is the order shown in --help. "GROUP NAME" registers
# NAME under the group GROUP (created on first use, with its help from _GROUP_HELP); each module
# has add_parser(subparsers). The leaves of ``job`` are deployments.jobs.JOBS, which _jobs reads.
# The bench leaves go up the layers: kernels, the memory tier in process, the serve layer in
# process, then Ray and a running cluster; they share the arguments of _bench_args.
COMMANDS: dict[str, str] = {
    "up": "recallserve.deployments.cli._up",
    "deploy": "recallserve.deployments.cli._deploy",
    "status": "recallserve.deployments.cli._status",
    "models": "recallserve.deployments.cli._models",
    "serve-config": "recallserve.deployments.cli._serve_config",
    "demo": "recallserve.deployments.cli._demo",
    "bench kernels": "recallserve.deployments.cli._bench_kernels",
    "bench memory": "recallserve.deployments.cli._bench_memory",
    "bench gather": "recallserve.deployments.cli._bench_gather",
    "bench restart": "recallserve.deployments.cli._bench_restart",
    "bench scan-layout": "recallserve.deployments.cli._bench_scan_layout",
    "bench search-cost": "recallserve.deployments.cli._bench_search_cost",
    "bench api-search": "recallserve.deployments.cli._bench_api_search",
    "bench mcp-search": "recallserve.deployments.cli._bench_mcp_search",
    "bench ingest": "recallserve.deployments.cli._bench_ingest",
    "bench verify": "recallserve.deployments.cli._bench_verify",
    "bench embed-gather": "recallserve.deployments.cli._bench_embed_gather",
    "bench prefix-states": "recallserve.deployments.cli._bench_prefix_states",
    "bench state-store": "recallserve.deployments.cli._bench_state_store",
    "bench search-seed": "recallserve.deployments.cli._bench_search_seed",
    "bench search": "recallserve.deployments.cli._bench_search",
    "bench languages": "recallserve.deployments.cli._bench_languages",
    "bench chat": "recallserve.deployments.cli._bench_chat",
    "eval agent": "recallserve.deployments.cli._eval_agent",
    "eval retention": "recallserve.deployments.cli._eval_retention",
    "eval experiences": "recallserve.deployments.cli._eval_experiences",
    "eval locomo": "recallserve.deployments.cli._eval_locomo",
    "eval ranker": "recallserve.deployments.cli._eval_ranker",
    "job *": "recallserve.deployments.cli._jobs",
}
_GROUP_HELP: dict[str, str] = {
    "bench": "benchmarks that print a table and write JSON rows",
    "eval": "quality evaluations",
    "job": "batch maintenance jobs on the Ray cluster",
}


def build_parser() -> argparse.ArgumentParser:
    """Build the full argument parser."""
    parser = argparse.ArgumentParser(prog="recallserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    groups: dict[str, argparse._SubParsersAction] = {}  # type: ignore[type-arg]
    for command, module in COMMANDS.items():
        group, _, leaf = command.partition(" ")
        if not leaf:
            importlib.import_module(module).add_parser(sub)
            continue
        if group not in groups:
            gparser = sub.add_parser(group, help=_GROUP_HELP[group])
            groups[group] = gparser.add_subparsers(dest="subcommand", required=True, metavar="NAME")
        importlib.import_module(module).add_parser(groups[group])
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
    # NOTE: the command as typed, for reports that record how they were made (not sys.argv: a
    # test or another program may call main() with its own list).
    args.argv = list(sys.argv[1:] if argv is None else argv)
    try:
        code = args.func(args)
    except UserError as exc:
        print(f"recallserve: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("recallserve: interrupted", file=sys.stderr)
        return 130
    return int(code or 0)


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
