"""``recallserve serve-config``: write a profile as a Ray Serve config (``serve deploy`` / KubeRay)."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from recallserve.deployments.cli import UserError, add_profile_arguments

__all__ = ["add_parser"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:
    """Register ``serve-config``."""
    p = subparsers.add_parser(
        "serve-config",
        help="render a profile as a Ray Serve config file (serve deploy, KubeRay serveConfigV2, the Helm chart)",
    )

    add_profile_arguments(p)
    p.add_argument(
        "--target", choices=("local", "kubernetes"), default="local",
        help="local: serve deploy on this machine; kubernetes: a RayService serveConfigV2 / the Helm chart",
    )
    p.add_argument("--data-dir", default=None, help="kubernetes only: shard data folder inside the pods")
    p.add_argument("--out", type=Path, default=None, help="write here instead of stdout")
    p.add_argument(
        "--check", type=Path, default=None, metavar="FILE",
        help="exit 1 if FILE differs from the render (keeps committed renders, e.g. the chart's, in sync)",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Render and write (or check) the Serve config; returns the exit code."""
    from recallserve.deployments.config import ConfigError, load_config
    from recallserve.deployments.serve_config import dropped_auth_keys, dump_serve_config, render_serve_config

    try:
        config = load_config(profile=args.profile, path=args.config)
        rendered = render_serve_config(config, target=args.target, data_dir=args.data_dir)
    except ConfigError as exc:
        raise UserError(str(exc)) from None
    text = dump_serve_config(rendered)
    dropped = dropped_auth_keys(config, args.target)
    if dropped:
        print(
            f"note: left out {dropped} literal API key(s) from auth.keys; on Kubernetes keys come from "
            "the RECALLSERVE_API_KEYS secret (helm value apiKeys)",
            file=sys.stderr,
        )
    if args.check is not None:
        try:
            current = args.check.read_text()
        except OSError as exc:
            raise UserError(f"--check: cannot read {args.check}: {exc}") from None
        if current != text:
            print(f"{args.check} is out of date with the profile; rerun without --check and with --out {args.check}",
                  file=sys.stderr)
            return 1
        print(f"{args.check} is up to date")
        return 0
    if args.out is not None:
        try:
            args.out.parent.mkdir(parents=True, exist_ok=True)
            args.out.write_text(text)
        except OSError as exc:
            raise UserError(f"--out: cannot write {args.out}: {exc}") from None
        print(f"wrote {args.out}", file=sys.stderr)
    else:
        sys.stdout.write(text)
    return 0
