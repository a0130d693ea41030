"""The ``recallserve`` console script: ``recallserve up|deploy|models|bench|eval|job ...``.

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

__all__ = ["main", "UserError", "add_profile_arguments"]


class UserError(Exception):
    """An error caused by the user's input or environment; printed as one line."""


def add_profile_arguments(p: argparse.ArgumentParser) -> None:
    """``--profile NAME | --config FILE`` (exclusive): which cluster config a command works on."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", default=None, help="built-in profile name (default: cpu-local)")
    src.add_argument("--config", type=Path, default=None, help="a profile YAML file instead of a built-in profile")


# NOTE: order is the order shown in --help. Groups map to leaf modules; each leaf module
# registers one parser under its group.
_TOP: dict[str, str] = {
    "up": "serve.cli._up",
    "deploy": "serve.cli._deploy",
    "models": "serve.cli._models",
    "serve-config": "serve.cli._serve_config",
}
_GROUPS: dict[str, tuple[str, dict[str, str]]] = {
    "bench": ("benchmarks that print a table and write JSON rows", {}),
    "eval": ("quality evaluations", {}),
    "job": ("batch maintenance jobs on the Ray cluster", {}),
}


def register_group_command(group: str, name: str, module: str) -> None:
    """Add a leaf command to a group (used by the modules listed in ``_LEAVES``)."""
    _GROUPS[group][1][name] = module


# Leaf commands of the groups: (group, name, module). Each module has add_parser(subparsers).
_LEAVES: list[tuple[str, str, str]] = [
    ("eval", "agent", "serve.cli._eval_agent"),
    ("bench", "memory", "serve.cli._bench_memory"),
    ("eval", "retention", "serve.cli._eval_retention"),
    ("eval", "experiences", "serve.cli._eval_experiences"),
    ("eval", "locomo", "serve.cli._eval_locomo"),
    # NOTE: one module registers all four jobs (expiry-sweep, reembed, consolidate, resummarise).
    ("job", "*", "serve.cli._jobs"),
]
for _group, _name, _module in _LEAVES:
    register_group_command(_group, _name, _module)


def build_parser() -> argparse.ArgumentParser:
    """Build the full argument parser."""
    parser = argparse.ArgumentParser(prog="recallserve", description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for _name, module in _TOP.items():
        importlib.import_module(module).add_parser(sub)
    for group, (help_text, leaves) in _GROUPS.items():
        gparser = sub.add_parser(group, help=help_text)
        gsub = gparser.add_subparsers(dest="subcommand", required=True, metavar="NAME")
        for _leaf, module in leaves.items():
            importlib.import_module(module).add_parser(gsub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the console script; returns the process exit code."""
    parser = build_parser()
    args = parser.parse_args(argv)
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
