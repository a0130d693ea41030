"""Command-line options shared by every job (light: no heavy imports at module load).

Used by ``python -m recallserve.deployments.jobs.<name>`` (and so ``ray job submit -- python -m ...``) and by
``recallserve job <name>``, so both accept the same flags.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from recallserve.deployments.jobs import JOBS
from recallserve.deployments.jobs._options import JobOptions, LiveOptions
from recallserve.memory_shards.embedders import embedder_identity

__all__ = ["add_common_arguments", "add_live_arguments", "live_from_args", "options_from_args", "print_report", "run_main"]


def add_common_arguments(p: argparse.ArgumentParser) -> None:
    """Flags of :class:`recallserve.deployments.jobs.JobOptions` plus where the defaults come from."""
    src = p.add_mutually_exclusive_group()
    src.add_argument("--profile", default=None, help="profile giving memory.data_dir, num_shards and the embedder (default cpu-local)")
    src.add_argument("--config", type=Path, default=None, help="a profile YAML file instead")
    p.add_argument("--data-dir", type=Path, default=None, help="memory data root (default: the profile's memory.data_dir)")
    p.add_argument("--num-shards", type=int, default=None, help="shards to process (default: every shard-<i> folder)")
    p.add_argument("--model-id", default=None, help="embedding model id of the stored vectors (default: the profile's embedder)")
    p.add_argument("--dim", type=int, default=None, help="vector dimension (default: the profile's embedder)")
    p.add_argument("--checkpoint", type=Path, default=None, help="checkpoint file (default <data-dir>/.jobs/<job>.json)")
    p.add_argument("--restart", action="store_true", help="start over, ignoring an existing checkpoint")
    p.add_argument("--dry-run", action="store_true", help="report what would change; write nothing")
    p.add_argument("--batch-size", type=int, default=256, help="records per batch and checkpoint")
    p.add_argument("--no-progress", action="store_true", help="no progress bars")
    p.add_argument("--json", action="store_true", help="print the report as JSON")


def add_live_arguments(p: argparse.ArgumentParser, *, via: str = "the shard deployments", instead_of: str = "the folders") -> None:
    """Flags of a job that can also run through a running cluster's deployments."""
    p.add_argument("--live", action="store_true",
                   help=f"work through {via} of the running app (while it serves) instead of {instead_of}")
    p.add_argument("--app", default=None, help="Serve application name with --live (default: the profile's name, as `recallserve up` deploys it)")
    p.add_argument("--ray-address", default=None,
                   help="Ray address with --live (default: $RAY_ADDRESS, else the local cluster using the profile's ray.temp_dir)")


def live_from_args(args: argparse.Namespace) -> Any:
    """:class:`recallserve.deployments.jobs.LiveOptions` when ``--live`` was given, else None.

    Raises:
        ValueError: ``--app``/``--ray-address`` without ``--live`` (names the flag).
    """
    if not args.live:
        for flag in ("app", "ray_address"):
            if getattr(args, flag) is not None:
                raise ValueError(f"--{flag.replace('_', '-')}: only meaningful with --live")
        return None
    from recallserve.deployments.config import load_config

    config = load_config(profile=args.profile, path=args.config)
    # NOTE: the serving generation's shards (memory_shard_<generation>_<i> once a re-embed made a
    # named generation the memory tier).
    return LiveOptions(app=args.app or config.name, address=args.ray_address or config.ray.address,
                       temp_dir=config.ray.temp_dir, auth_disabled=config.ray.auth_disabled,
                       generation=config.memory.generation)


def options_from_args(args: argparse.Namespace) -> Any:
    """Build :class:`JobOptions` from the flags, filling gaps from the profile."""
    from recallserve.deployments.config import load_config

    config = load_config(profile=args.profile, path=args.config)
    model_id, dim = args.model_id, args.dim
    if model_id is None or dim is None:
        # NOTE: the memory tier's embedder: its own (memory.embedder) or the cluster's.
        default_id, default_dim = embedder_identity((config.memory.embedder or config.embedder).model)
        model_id, dim = model_id or default_id, dim or default_dim
    return JobOptions(
        data_dir=args.data_dir or config.memory.data_dir,
        num_shards=args.num_shards,
        model_id=model_id,
        dim=dim,
        checkpoint=args.checkpoint,
        restart=args.restart,
        dry_run=args.dry_run,
        batch_size=args.batch_size,
        progress=not args.no_progress,
    )


def print_report(report: Any, as_json: bool) -> None:
    """One line per counter, or the JSON report."""
    if as_json:
        print(json.dumps(report.model_dump(), indent=2))
        return
    mode = "dry run: would change" if report.dry_run else "done"
    resumed = " (resumed from checkpoint)" if report.resumed else ""
    print(f"{report.job}: {mode}{resumed}; {report.shards} shard(s) in {report.seconds:.1f} s")
    for key, value in sorted(report.stats.items()):
        print(f"  {key:<24} {value}")
    for key, value in report.extra.items():
        print(f"  {key:<24} {value}")
    if report.checkpoint:
        print(f"  checkpoint               {report.checkpoint}")


def run_main(job: str, add_arguments: Callable[[argparse.ArgumentParser], None],
             run: Callable[[argparse.Namespace], Any], argv: list[str] | None = None) -> int:
    """``python -m recallserve.deployments.jobs.<name>`` entry: parse, run, print; one-line errors, exit 2.

    ``job`` is the job's name in :data:`recallserve.deployments.jobs.JOBS` (its help and whether it takes the
    shared shard flags come from there).
    """
    spec = JOBS[job]
    p = argparse.ArgumentParser(description=spec.help)
    if spec.shard_flags:
        add_common_arguments(p)
    add_arguments(p)
    args = p.parse_args(argv)
    try:
        report = run(args)
    except (ValueError, RuntimeError) as exc:
        print(f"{p.prog}: error: {exc}", file=sys.stderr)
        return 2
    print_report(report, args.json)
    return 0
