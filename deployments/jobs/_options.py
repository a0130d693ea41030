"""What a maintenance job takes and gives back: its options, the live cluster's address, its report, its error.

Light (pydantic only), so the command line (``_args``) and the live connection (``_live``) use
them without importing the shards; the loop over the shards is in ``_common``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import Field

from recallserve.kernels import StrictModel

__all__ = ["JobError", "JobOptions", "JobReport", "LiveOptions"]


class JobError(RuntimeError):
    """A job cannot run (bad data root, a shard held by a running cluster, a foreign checkpoint)."""


class JobOptions(StrictModel):
    """Options common to every job."""

    data_dir: Path = Field(description="Memory data root holding shard-<i> folders.")
    num_shards: int | None = Field(default=None, ge=1, le=4096, description="Shards to process; None = every shard-<i> folder found.")
    model_id: str = Field(min_length=1, description="Embedding model id of the stored vectors.")
    dim: int = Field(gt=0, le=8192, description="Vector dimension of the stored vectors.")
    checkpoint: Path | None = Field(default=None, description="Checkpoint file; default <data_dir>/.jobs/<job>.json.")
    restart: bool = Field(default=False, description="Ignore (and replace) an existing checkpoint.")
    dry_run: bool = Field(default=False, description="Report what would change; write nothing (not even the checkpoint).")
    batch_size: int = Field(default=256, ge=1, le=100_000, description="Records per batch (one checkpoint per batch).")
    progress: bool = Field(default=True, description="Show a progress bar per shard.")


class LiveOptions(StrictModel):
    """Where a live job finds the running cluster and the app whose shard deployments it works through."""

    app: str = Field(min_length=1, max_length=256, description="Ray Serve application holding the memory_shard_<i> deployments.")
    address: str | None = Field(default=None, max_length=512, description="Ray address; None: RAY_ADDRESS, else the local cluster using temp_dir.")
    temp_dir: Path = Field(default=Path(".recallserve/ray"), description="Ray temp folder of the local cluster (the runner's ray.temp_dir).")
    auth_disabled: bool = Field(default=True, description="Set RAY_AUTH_MODE=disabled before connecting (as the runner does).")
    call_timeout_s: float = Field(default=300.0, gt=0, le=3600, description="Seconds one shard call may take before the job stops.")
    generation: str = Field(default="", max_length=16, description="Memory generation whose shards the job walks ('' = memory_shard_<i>).")


class JobReport(StrictModel):
    """What a job did (or, in a dry run, would do)."""

    job: str = Field(description="Job name.")
    dry_run: bool = Field(description="True when nothing was written.")
    resumed: bool = Field(description="True when the run continued from a checkpoint.")
    shards: int = Field(description="Shards processed in this run (including resumed ones).")
    stats: dict[str, int] = Field(description="Counters (seen, deleted, demoted, ...).")
    seconds: float = Field(description="Wall time of this run.")
    checkpoint: str | None = Field(description="Checkpoint file path (None in a dry run).")
    extra: dict[str, Any] = Field(default_factory=dict, description="Job-specific results (e.g. the re-embed target).")
