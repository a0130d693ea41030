"""``recallserve models list|path|verify``: what chat models are installed, joined and verified."""

from __future__ import annotations

import argparse
import sys

from recallserve.deployments.cli import UserError
from recallserve.deployments.models import (
    BUILTIN_MODELS,
    ModelError,
    ModelNotInstalledError,
    builtin_status,
    ensure_builtin,
    get_builtin,
)
from recallserve.serve import envs

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``models`` and its three subcommands."""
    p = subparsers.add_parser("models", help="list, locate and verify the built-in chat models")
    sub = p.add_subparsers(dest="models_command", required=True, metavar="ACTION")

    p_list = sub.add_parser("list", help="show each built-in model: installed? joined? verified? size, source")
    p_list.set_defaults(func=_run_list)

    p_path = sub.add_parser("path", help="print the local GGUF path of a model (joins and verifies it first)")
    p_path.add_argument("name", help="a built-in model name (see `recallserve models list`)")
    p_path.set_defaults(func=_run_path)

    p_verify = sub.add_parser("verify", help="join if needed and re-hash a model (all installed ones if no NAME)")
    p_verify.add_argument("name", nargs="?", default=None, help="a built-in model name; default: every installed one")
    p_verify.set_defaults(func=_run_verify)


def _human(size: int | None) -> str:
    if size is None:
        return "-"
    # NOTE: decimal units, as pip and tqdm (unit_scale) print them.
    for unit in ("B", "kB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.2f} {unit}"
        size /= 1000  # type: ignore[assignment]
    return str(size)


def _yes(flag: bool) -> str:
    return "yes" if flag else "no"


def _run_list(args: argparse.Namespace) -> int:
    print(f"cache folder: {envs.models_dir()}  (set RECALLSERVE_HOME to move it)")
    header = f"{'name':<38} {'installed':<9} {'joined':<6} {'verified':<8} {'size':>9}  source"
    print(header)
    print("-" * len(header))
    for model in BUILTIN_MODELS.values():
        st = builtin_status(model)
        first, last = model.distributions[0], model.distributions[-1]
        source = first if len(model.distributions) == 1 else f"{first} .. {last.split('==')[0]} ({len(model.distributions)} parts)"
        print(
            f"{model.name:<38} {_yes(st.installed):<9} {_yes(st.joined) if model.joined else 'n/a':<6} "
            f"{_yes(st.verified):<8} "
            f"{_human(st.size_bytes):>9}  {source}"
        )
        print(f"    {model.summary}")
        print(f"    license: {model.license_note}")
        if not st.installed:
            print(f"    install: {model.install_hint}")
        elif not st.verified:
            action = "joins and verifies" if model.joined else "verifies"
            print(f"    first use (or `recallserve models verify {model.name}`) {action} it")
    return 0


def _run_path(args: argparse.Namespace) -> int:
    try:
        path = ensure_builtin(get_builtin(args.name))
    except ModelError as exc:
        raise UserError(str(exc)) from None
    print(path)
    return 0


def _run_verify(args: argparse.Namespace) -> int:
    if args.name is not None:
        try:
            models = [get_builtin(args.name)]
        except ModelError as exc:
            raise UserError(str(exc)) from None
    else:
        models = list(BUILTIN_MODELS.values())
    failures = 0
    for model in models:
        try:
            path = ensure_builtin(model, force_verify=True)
        except ModelNotInstalledError as exc:
            if args.name is not None:
                raise UserError(str(exc)) from None
            print(f"skip  {model.name}: not installed ({model.install_hint})")
            continue
        except ModelError as exc:
            print(f"FAIL  {model.name}: {exc}", file=sys.stderr)
            failures += 1
            continue
        print(f"ok    {model.name}: {path} sha256 {model.sha256}")
    return 1 if failures else 0
