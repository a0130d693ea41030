"""Live mode of the maintenance jobs: the shard deployments of a running Ray Serve app.

``connect`` finds the cluster (in this order)::

    already connected in this process (a test, a notebook)   -> use it, leave it running
    LiveOptions.address (--ray-address), else $RAY_ADDRESS     -> ray.init(address=...)
    a raylet on this machine started with temp_dir             -> ray.init(address=its GCS address)

The last one is how ``recallserve up`` (an embedded Ray with ``ray.temp_dir``, default
``.recallserve/ray``) is found without guessing among other clusters on the machine; under
``ray job submit`` Ray sets ``RAY_ADDRESS`` for the driver. Each shard ``i`` is the deployment
``memory_shard_<i>`` of the app (``memory_shard_<generation>_<i>`` for a named generation);
:class:`LiveShardAccess` calls its ``page`` / ``apply`` / ``neighbours`` / ``snapshot`` /
``stats`` / ``lookup`` / ``insert_absent`` / ``touch`` methods through the handle and waits for
each result, so a job keeps its one-batch-at-a-time order and its checkpoints mean what they say.
"""

from __future__ import annotations

import contextlib
import logging
import os
import re
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from recallserve.deployments._ray_paths import ray_temp_dir_names
from recallserve.deployments.jobs._options import JobError, LiveOptions
from recallserve.memory_shards import EmbeddedRecord, MemoryRecord

__all__ = ["LiveCluster", "LiveShardAccess", "connect", "find_local_cluster", "ray_connection"]


def find_local_cluster(temp_dir: Path) -> str | None:
    """GCS address of a running raylet on this machine whose ``--temp_dir`` is ``temp_dir``, or None."""
    import psutil

    wanted = {f"--temp_dir={name}" for name in ray_temp_dir_names(temp_dir)}
    for proc in psutil.process_iter(["cmdline"]):
        try:
            cmdline = proc.info["cmdline"] or []
        except (psutil.AccessDenied, psutil.NoSuchProcess):
            continue
        if not cmdline or not os.path.basename(cmdline[0]).startswith("raylet"):
            continue
        args = " ".join(cmdline).split(" ")
        if wanted.isdisjoint(args):
            continue
        for arg in args:
            if arg.startswith("--gcs-address="):
                return arg.split("=", 1)[1]
    return None


class LiveShardAccess:
    """:class:`~recallserve.memory_shards.shard_access.ShardAccess` over one shard deployment's handle."""

    def __init__(self, handle: Any, index: int, timeout_s: float) -> None:
        self._handle = handle
        self.index = index
        self._timeout_s = timeout_s

    def _call(self, method: str, *args: Any) -> Any:
        from ray.exceptions import RayError
        from ray.serve.exceptions import RayServeException

        try:
            return getattr(self._handle, method).remote(*args).result(timeout_s=self._timeout_s)
        except (RayError, RayServeException, TimeoutError) as exc:
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
            raise JobError(f"shard {self.index}: {method} failed ({type(exc).__name__}: {first[:200]}); "
                           "rerun the same command to resume from the checkpoint") from None

    def count(self) -> int:
        return int(self._call("stats")["records"])

    def page(self, after_id: str | None, limit: int) -> list[EmbeddedRecord]:
        return self._call("page", after_id, limit)

    def apply(self, deletes: Mapping[str, Sequence[str]], upserts: Sequence[EmbeddedRecord], expected: Mapping[str, str],
              touches: Mapping[str, float] | None = None, all_or_nothing: bool = False) -> dict[str, list[str]]:
        return self._call("apply", {t: list(ids) for t, ids in deletes.items()}, list(upserts), dict(expected),
                          None if touches is None else dict(touches), all_or_nothing)

    def neighbours(self, record_id: str, k: int, threshold: float) -> list[MemoryRecord]:
        return self._call("neighbours", record_id, k, threshold)

    def snapshot(self) -> None:
        self._call("snapshot")

    def lookup(self, ids: Sequence[str]) -> list[MemoryRecord | None]:
        return self._call("lookup", list(ids))

    def insert_absent(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        return self._call("insert_absent", list(items))

    def touch(self, ids: Sequence[str], at: Sequence[float]) -> None:
        self._call("touch", list(ids), list(at))
        self._call("flush")


class LiveCluster:
    """The app's shard deployments on a connected cluster."""

    def __init__(self, opts: LiveOptions) -> None:
        from ray import serve
        from ray.serve.exceptions import RayServeException

        self._opts = opts
        try:
            apps = serve.status().applications
        except RayServeException as exc:
            raise JobError(f"live: Ray Serve is not running on this cluster ({exc}); start it with `recallserve up`") from None
        app = apps.get(opts.app)
        if app is None:
            running = ", ".join(sorted(apps)) or "none"
            raise JobError(f"app: no Serve application {opts.app!r} on this cluster (running: {running}); pass --app NAME")
        state = str(getattr(app.status, "value", app.status))
        if state != "RUNNING":
            raise JobError(f"app: Serve application {opts.app!r} is {state}, not RUNNING; wait for it or fix it first")
        self.deployments = set(app.deployments)
        prefix = f"memory_shard_{opts.generation}_" if opts.generation else "memory_shard_"
        pattern = re.compile(re.escape(prefix) + r"(\d+)")
        self._prefix = prefix
        self.available = sorted(int(m.group(1)) for name in app.deployments if (m := pattern.fullmatch(name)))

    def shard_indices(self, num_shards: int | None) -> list[int]:
        """Shards to process: ``0..num_shards-1`` (all must be deployed) or every deployed one.

        Raises:
            JobError: the app has no shard deployments, or lacks some of ``0..num_shards-1``.
        """
        if not self.available:
            raise JobError(f"app: Serve application {self._opts.app!r} has no {self._prefix}<i> deployments")
        if num_shards is None:
            return list(self.available)
        missing = [i for i in range(num_shards) if i not in self.available]
        if missing:
            raise JobError(f"num_shards: app {self._opts.app!r} lacks shard deployments {missing} (it has {self.available})")
        return list(range(num_shards))

    @contextlib.contextmanager
    def shard(self, index: int, generation: str | None = None) -> Iterator[LiveShardAccess]:
        """Access to shard ``index`` (of ``generation``, default the options') through its deployment handle."""
        yield self.access(index, generation)

    def access(self, index: int, generation: str | None = None) -> LiveShardAccess:
        """:class:`LiveShardAccess` of shard ``index`` of ``generation`` (default: the options')."""
        from ray import serve

        from recallserve.deployments.config import shard_deployment_name

        gen = self._opts.generation if generation is None else generation
        handle = serve.get_deployment_handle(shard_deployment_name(index, gen), app_name=self._opts.app)
        return LiveShardAccess(handle, index, self._opts.call_timeout_s)

    def handle(self, deployment: str) -> Any:
        """A handle of another deployment of the app (e.g. an embedder).

        Raises:
            JobError: the app has no such deployment.
        """
        from ray import serve

        if deployment not in self.deployments:
            raise JobError(f"app: Serve application {self._opts.app!r} has no deployment {deployment!r}")
        return serve.get_deployment_handle(deployment, app_name=self._opts.app)


@contextlib.contextmanager
def ray_connection(address: str | None, temp_dir: Path, auth_disabled: bool = True) -> Iterator[None]:
    """Be connected to the running Ray cluster for the block (see the module docstring for the
    order it is looked for in); disconnect on exit only if this connected.

    Raises:
        JobError: no cluster found, or it cannot be reached.
    """
    if auth_disabled:
        os.environ.setdefault("RAY_AUTH_MODE", "disabled")
    # NOTE: Ray would otherwise print usage-stats prompts and try to reach the network.
    os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    import ray

    ours = False
    if not ray.is_initialized():
        address = address or os.environ.get("RAY_ADDRESS") or find_local_cluster(temp_dir)
        if not address:
            raise JobError(f"ray: no running Ray cluster found (no raylet with temp dir {temp_dir}, no RAY_ADDRESS); "
                           "start it with `recallserve up` or pass --ray-address")
        try:
            ray.init(address=address, log_to_driver=False, logging_level=logging.WARNING)
        except (ConnectionError, RuntimeError, ValueError) as exc:
            raise JobError(f"ray: cannot connect to the Ray cluster at {address}: {str(exc).splitlines()[0][:200]}") from None
        ours = True
    try:
        yield
    finally:
        if ours:
            ray.shutdown()


@contextlib.contextmanager
def connect(opts: LiveOptions) -> Iterator[LiveCluster]:
    """Connect to the running cluster (:func:`ray_connection`) and its app's shard deployments.

    Raises:
        JobError: no cluster found or reachable, Serve not running, the app missing or not running.
    """
    with ray_connection(opts.address, opts.temp_dir, opts.auth_disabled):
        yield LiveCluster(opts)
