"""Batch maintenance jobs over the memory shards, runnable three ways with the same flags::

    recallserve job expiry-sweep --dry-run
    python -m recallserve.deployments.jobs.expiry_sweep --data-dir /data/recallserve/memory
    ray job submit -- python -m recallserve.deployments.jobs.reembed --embedder minilm --target /data/memory-v2

Jobs: ``expiry-sweep`` (delete expired, demote decayed to archival), ``reembed`` (a new embedder
into new shards: from folders, or ``--live`` into a migration's generation without downtime),
``consolidate`` (merge near-duplicate memories), ``enrich`` (the router model's atomic facts of each
stored exchange, kept as parts of it), ``resummarise`` (refresh the rolling summary of
long sessions in the session store).
Each is resumable (checkpoint file), shows progress and has ``--dry-run``; see ``_common``.

``expiry-sweep`` and ``consolidate`` also run while the cluster serves::

    recallserve job expiry-sweep --live                 # beside `recallserve up` (same profile)
    ray job submit -- python -m recallserve.deployments.jobs.consolidate --live --app recallserve

With ``--live`` they connect to the running Ray cluster (``--ray-address``, ``$RAY_ADDRESS``,
else the local cluster started with the profile's ``ray.temp_dir``) and work through the app's
``memory_shard_<i>`` deployments (``_live``) instead of opening the folders (which the serving
shards lock). The per-batch logic is the same in both modes (``run_access_job`` over the
``ShardAccess`` interface of ``recallserve.memory_shards.shard_access``); every change is a compare-and-set on the
record's content version, so a job never overwrites a write a user made after it read the
record (those are counted as ``conflicts``). ``reembed --live`` fills the new generation of a
memory migration (``memory.migration`` in the deployed config) while every write goes to both
generations; see ``reembed`` and docs/operations.md, "Re-embedding without downtime".
"""

from typing import NamedTuple

from recallserve.deployments.jobs._options import JobError, JobOptions, JobReport, LiveOptions
from recallserve.kernels import lazy_exports

__all__ = [
    "JOBS",
    "Checkpoint",
    "JobError",
    "JobOptions",
    "JobReport",
    "JobSpec",
    "LiveOptions",
    "discover_shards",
    "open_shard",
    "run_access_job",
    "run_shard_job",
]



class JobSpec(NamedTuple):
    """One batch job: where it lives and how it is offered on the command line."""

    module: str
    """Module with ``add_arguments(parser)``, ``run(args) -> JobReport`` and ``main`` (``python -m`` runs it)."""
    help: str
    """One line: ``recallserve job --help`` and the ``python -m`` description."""
    shard_flags: bool
    """Takes the shared ``--data-dir``/``--checkpoint``/``--dry-run``... flags (``_args.add_common_arguments``)."""


#: The one list of jobs, CLI name -> spec; ``recallserve job NAME`` and ``python -m`` both read it.
JOBS: dict[str, JobSpec] = {
    "expiry-sweep": JobSpec("recallserve.deployments.jobs.expiry_sweep",
                            "delete expired memories and demote decayed ones to the archival tier", True),
    "reembed": JobSpec("recallserve.deployments.jobs.reembed",
                       "re-embed every memory with a new embedder into new shards (switch without downtime)", True),
    "consolidate": JobSpec("recallserve.deployments.jobs.consolidate",
                           "merge near-duplicate memories of each tenant (keep the newest)", True),
    "erase": JobSpec("recallserve.deployments.jobs.erase",
                     "erase everything held for one end user, or a whole tenant (cluster stopped; see docs/erasure.md)",
                     True),
    "enrich": JobSpec("recallserve.deployments.jobs.enrich",
                      "write the atomic facts of each stored exchange (router model) as parts of its record", True),
    "resummarise": JobSpec("recallserve.deployments.jobs.resummarise",
                           "refresh the rolling summary of long sessions (extractive or the summariser model)", False),
}

# NOTE: names from _common load on first use, so that ``recallserve --help`` (which imports the
# light ``_args`` module of this package) does not import torch through memory_shards.
_LAZY = dict.fromkeys(("Checkpoint", "discover_shards", "open_shard", "run_access_job", "run_shard_job"),
                      "recallserve.deployments.jobs._common")
__getattr__ = lazy_exports(__name__, _LAZY)
