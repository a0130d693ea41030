"""The memory tier on Ray Serve: the embedder and shard deployment bodies, and the handle adapters.

* :class:`EmbedderDeployment`: MiniLM behind Ray Serve dynamic batching: concurrent ``embed``
  calls (one per request, each a list of texts) are grouped up to ``embedder.max_batch_size``
  requests or ``embedder.batch_wait_timeout_s``, then embedded in one forward pass.
* :class:`MemoryShardDeployment`: one :class:`~recallserve.memory_shards.retrieval.HybridShard` (vectors,
  columns, WAL, snapshots and its BM25 index) in ``memory.data_dir/shard-<i>``. A replica that
  dies loses nothing acknowledged: the next replica replays the WAL of the same folder. Live
  maintenance jobs (``recallserve.deployments.jobs`` with ``--live``) page through it (``page``), change it
  by compare-and-set (``apply``) and look up duplicates (``neighbours``) while it serves.
* :func:`bind_memory`: wraps both with ``serve.deployment`` using the config's options, once per
  memory generation (the serving one and, during a zero-downtime re-embed, the migration's).
* :class:`HandleMemoryBackend`: the :class:`~recallserve.serve.memory_api.MemoryService` (memory API and the
  chat pipeline's ``MemoryBackend``) over the deployment handles; the coordinator fans out to
  the shards concurrently (``asyncio.gather`` over handle calls).
* :func:`memory_backend`: that service for the bound generations: one generation's, or a
  :class:`~recallserve.serve.memory_api.MigratingMemoryService` writing to both while a migration runs.
"""

from __future__ import annotations

import asyncio
import functools
import time
from concurrent.futures import ThreadPoolExecutor
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
from ray import serve
from ray.exceptions import RayError, RayTaskError
from ray.serve.exceptions import BackPressureError, RayServeException
from ray.serve.handle import DeploymentHandle

from recallserve.deployments._placement import PlacementInfo
from recallserve.deployments._versions import pin_version
from recallserve.deployments.config import AppConfig, EmbedderConfig, MemoryConfig, shard_deployment_name
from recallserve.memory_shards import CallGatherer
from recallserve.memory_shards.shard_access import SortedIds, hybrid_apply, hybrid_insert_absent, neighbour_records, page_records
from recallserve.memory_shards.config import SearchFilters, ShardConfig
from recallserve.memory_shards.coordinator import MemoryCoordinator, ShardUnavailable
from recallserve.memory_shards.embedders import MiniLMEmbedder, build_embedder, embedder_identity
from recallserve.memory_shards.onnx_embedder import OnnxMiniLMEmbedder
from recallserve.memory_shards.records import EmbeddedRecord, MemoryRecord
from recallserve.memory_shards.retrieval import HybridShard, ShardHybridResult
from recallserve.memory_shards.shard import MemoryShard
from recallserve.serve import envs
from recallserve.serve.api.errors import APIError
from recallserve.serve.api.metrics import MEMORY_HOP, MEMORY_ROUTING
from recallserve.serve.memory_api import MemoryService, MigratingMemoryService, SearchAdmission
from recallserve.serve.pii import PiiMode

__all__ = [
    "EmbedderDeployment",
    "MemoryShardDeployment",
    "HandleShardClient",
    "HandleMemoryBackend",
    "bind_memory",
    "memory_backend",
    "LocalEmbedders",
    "shard_deployment_name",
    "EMBEDDER_DEPLOYMENT",
]

EMBEDDER_DEPLOYMENT = "embedder"
_FAILURES = (RayError, RayServeException, BackPressureError)
# NOTE: a restarted replica may start while the dying one still holds the data folder's lock
# (flock is released when its process exits); wait this long before failing the replica.
_LOCK_WAIT_S = 30.0
# NOTE: threads for one shard replica's calls, so up to 64 concurrent searches can share one scan.
_CALL_THREADS = 64


class EmbedLanes:
    """MiniLM and its two lanes of gathered calls: the embedder deployment's body, and the ingress's own copy.

    Two lanes: a call of at least ``bulk_min_texts`` texts (ingestion) goes to a gatherer of its
    own and runs as a bulk call of the ONNX embedder (``bulk_threads`` passes at once at
    ``bulk_niceness``), beside the forwards of the smaller calls. So a query embed does not wait
    for a 50-memory batch's forward to end (it did: the next forward started only after the
    running one), and ingestion gets the cores the query embeds and the chat model leave idle.
    Calls that arrive while a forward of their lane runs share the next one
    (:class:`recallserve.memory_shards._gather.CallGatherer`: ``max_batch_size`` calls per forward,
    ``batch_wait_timeout_s`` of waiting only when a call finds the model idle).

    Args:
        cfg: the embedder's config.
    """

    def __init__(self, cfg: EmbedderConfig) -> None:
        self.embedder = build_embedder(cfg.model, device=cfg.device, batch_size=cfg.forward_batch_size,
                                       torch_threads=cfg.threads, runtime=cfg.runtime,
                                       cache_dir=envs.recallserve_home() / "onnx", bulk_threads=cfg.bulk_threads,
                                       bulk_min_texts=cfg.bulk_min_texts, bulk_niceness=cfg.bulk_niceness)
        self.embedder.embed(["warm up"])  # load the weights before the replica reports healthy
        self._bulk_min_texts = cfg.bulk_min_texts
        self._gather: CallGatherer[list[str], np.ndarray] = CallGatherer(
            functools.partial(self._forward, bulk=False), max_items=cfg.max_batch_size,
            first_wait_s=cfg.batch_wait_timeout_s)
        # NOTE: no first wait in the bulk lane: a bulk call fills passes on its own.
        self._bulk_gather: CallGatherer[list[str], np.ndarray] = CallGatherer(
            functools.partial(self._forward, bulk=True), max_items=cfg.max_batch_size)

    async def _forward(self, requests: list[list[str]], bulk: bool) -> list[np.ndarray]:
        flat = [t for texts in requests for t in texts]
        # NOTE: the torch embedder has one way to run; only the ONNX one tells bulk calls apart.
        run = (functools.partial(self.embedder.embed, flat, bulk=bulk) if isinstance(self.embedder, OnnxMiniLMEmbedder)
               else functools.partial(self.embedder.embed, flat))
        with MEMORY_HOP.labels("embed_bulk_forward" if bulk else "embed_forward").time():
            vectors = await asyncio.to_thread(run)
        out, start = [], 0
        for texts in requests:
            out.append(vectors[start : start + len(texts)])
            start += len(texts)
        return out

    def embed_blocking(self, texts: Sequence[str]) -> np.ndarray:
        """Embed ``texts`` in the calling thread (a worker thread: context-mode and experiences).

        Not gathered with the lanes' calls: the caller waits in its own thread anyway, and ONNX
        Runtime's ``run`` is thread-safe, so a forward here runs beside the lanes' forwards.
        """
        with MEMORY_HOP.labels("embed_forward").time():
            return np.asarray(self.embedder.embed(list(texts)), dtype=np.float32)

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` -> [n, dim] unit-norm float32 (batched with concurrent callers of its lane)."""
        if not texts:
            return np.zeros((0, self.embedder.dim), dtype=np.float32)
        lane = self._bulk_gather if len(texts) >= self._bulk_min_texts else self._gather
        return await lane.submit(list(texts))


class EmbedderDeployment(PlacementInfo):
    """MiniLM behind its two lanes of gathered calls (:class:`EmbedLanes`).

    Batching is :class:`recallserve.memory_shards._gather.CallGatherer`, not ``@serve.batch``, whose batches
    of one pile up behind a running forward (the gatherer's docstring says why).

    Args:
        embedder: ``EmbedderConfig`` as plain data.
    """

    def __init__(self, embedder: dict[str, Any]) -> None:
        self._lanes = EmbedLanes(EmbedderConfig.model_validate(embedder))

    async def embed(self, texts: list[str]) -> np.ndarray:
        """Embed ``texts`` -> [n, dim] unit-norm float32 (batched with concurrent callers of its lane)."""
        return await self._lanes.embed(texts)

    def info(self) -> dict[str, Any]:
        """Model id and dimension."""
        return {"model_id": self._lanes.embedder.model_id, "dim": self._lanes.embedder.dim}


class MemoryShardDeployment(PlacementInfo):
    """One hybrid memory shard (single writer of its data folder).

    Args:
        index: shard index (its folder is ``data_dir/shard-<index>``).
        data_dir: absolute root folder of the shards.
        model_id: embedding model id of every vector.
        dim: vector dimension.
        placement: :class:`recallserve.memory_shards.config.ShardPlacement` fields (device, vector dtype, kernel backend).
    """

    def __init__(self, index: int, data_dir: str, model_id: str = MiniLMEmbedder.model_id, dim: int = MiniLMEmbedder.dim,
                 placement: dict[str, Any] | None = None) -> None:
        cfg = ShardConfig(shard_id=index, data_dir=str(Path(data_dir) / f"shard-{index}"), model_id=model_id, dim=dim,
                          **(placement or {}))
        deadline = time.monotonic() + _LOCK_WAIT_S
        while True:
            try:
                shard = MemoryShard(cfg)
                break
            except RuntimeError as exc:
                if "already open" not in str(exc) or time.monotonic() > deadline:
                    raise
                time.sleep(0.5)
        self._shard = HybridShard(shard)
        self._page_ids = SortedIds()
        # NOTE: the shard gathers the searches that wait while one scans (ShardConfig.gather_max_queries);
        # asyncio's default pool (cpu_count + 4 threads) would cap a batch at a few queries, so shard
        # calls get their own pool. Waiting threads only block on an event.
        self._pool = ThreadPoolExecutor(max_workers=_CALL_THREADS, thread_name_prefix=f"shard-{index}")

    async def _run(self, fn, *args: Any) -> Any:
        # NOTE: shard calls hold the shard's own lock; a thread keeps the replica's loop free
        # for health checks while a long scan or an fsync runs.
        return await asyncio.get_running_loop().run_in_executor(self._pool, functools.partial(fn, *args))

    async def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        return await self._run(self._shard.upsert, list(items))

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        return await self._run(self._shard.delete, tenant, list(ids))

    async def erase(self, tenant: str, user: str | None) -> list[str]:
        return await self._run(self._shard.erase, tenant, user)

    async def owned(self, tenant: str, user: str | None) -> list[MemoryRecord]:
        return await self._run(self._shard.owned, tenant, user)

    async def get(self, tenant: str, record_id: str) -> MemoryRecord | None:
        return await self._run(self._shard.get, tenant, record_id)

    async def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]:
        return await self._run(self._shard.list_by_source, tenant, source_id)

    async def search(self, queries, tenant, k, params, filters, now, touch):
        return await self._run(self._shard.search, queries, tenant, k, params, filters, now, touch)

    async def hybrid_search(self, query_vector, lexical_query, tenant, dense_k, lexical_k, params, filters, now):
        with MEMORY_HOP.labels("shard_search").time():
            return await self._run(self._shard.hybrid_search, query_vector, lexical_query, tenant, dense_k, lexical_k,
                                   params, filters, now)

    async def touch(self, ids: Sequence[str], at: Sequence[float]) -> None:
        await self._run(self._shard.touch, list(ids), list(at))

    async def flush(self) -> None:
        await self._run(self._shard.flush)

    async def snapshot(self) -> None:
        await self._run(self._shard.snapshot)

    async def stats(self) -> dict[str, Any]:
        return await self._run(self._shard.stats)

    # ---- maintenance jobs (deployments.jobs, --live) ------------------------------------
    async def page(self, after_id: str | None, limit: int) -> list[EmbeddedRecord]:
        """Up to ``limit`` records (all tenants, with vectors) with id > ``after_id``, in id order."""
        return await self._run(page_records, self._shard.shard, self._page_ids, after_id, limit)

    async def apply(self, deletes: dict[str, list[str]], upserts: Sequence[EmbeddedRecord], expected: dict[str, str],
                    touches: dict[str, float] | None = None, all_or_nothing: bool = False) -> dict[str, list[str]]:
        """Compare-and-set batch of a job (``MemoryShard.apply_if_unchanged``); WAL-durable on return.

        A record written since the job read it (its ``record_version`` differs, or it is gone) is
        skipped and listed under ``conflicts``; the BM25 index follows the applied changes.
        """
        return await self._run(hybrid_apply, self._shard, deletes, list(upserts), expected, touches, all_or_nothing)

    async def neighbours(self, record_id: str, k: int, threshold: float) -> list[MemoryRecord]:
        """Same-tenant records within ``threshold`` cosine of the record's main text (exact, no decay, no touch)."""
        return await self._run(neighbour_records, self._shard.shard, record_id, k, threshold)

    async def lookup(self, ids: Sequence[str]) -> list[MemoryRecord | None]:
        """The records with these ids, whatever their tenant (None where absent), for the re-embed job."""
        return await self._run(lambda: [self._shard.shard.record(i) for i in ids])

    async def insert_absent(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        """Insert only records new to the shard (``MemoryShard.insert_absent``); returns the inserted ids."""
        return await self._run(hybrid_insert_absent, self._shard, list(items))

    def __del__(self) -> None:
        shard = getattr(self, "_shard", None)
        if shard is not None:
            try:
                shard.close()
            except Exception:  # noqa: BLE001 - best effort at teardown; the WAL is already durable
                pass


class HandleShardClient:
    """A ``ShardClient`` + ``hybrid_search`` over a :class:`MemoryShardDeployment` handle.

    Ray failures become :class:`~memory_shards.ShardUnavailable` naming the shard; the
    coordinator adds the deadline (a replica that is gone leaves Serve's router waiting for a
    new one, which the deadline turns into an answer) and decides whether the request needed it.
    """

    def __init__(self, handle: DeploymentHandle, index: int) -> None:
        self._handle = handle
        self.index = index

    async def _call(self, method: str, *args: Any) -> Any:
        try:
            return await getattr(self._handle, method).remote(*args)
        except RayTaskError as exc:
            # NOTE: a ValueError raised by the shard itself is bad input (names the field), not an outage.
            cause = exc.as_instanceof_cause()
            if isinstance(cause, ValueError):
                raise APIError(400, str(exc.cause) if getattr(exc, "cause", None) else str(cause)) from exc
            raise ShardUnavailable(self.index, f"failed: {type(exc).__name__}") from exc
        except _FAILURES as exc:
            raise ShardUnavailable(self.index, type(exc).__name__) from exc

    async def upsert(self, items: Sequence[EmbeddedRecord]) -> list[str]:
        return await self._call("upsert", list(items))

    async def delete(self, tenant: str, ids: Sequence[str]) -> list[str]:
        return await self._call("delete", tenant, list(ids))

    async def erase(self, tenant: str, user: str | None) -> list[str]:
        return await self._call("erase", tenant, user)

    async def owned(self, tenant: str, user: str | None) -> list[MemoryRecord]:
        return await self._call("owned", tenant, user)

    async def get(self, tenant: str, record_id: str) -> MemoryRecord | None:
        return await self._call("get", tenant, record_id)

    async def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]:
        return await self._call("list_by_source", tenant, source_id)

    async def search(self, queries, tenant, k, params, filters: SearchFilters | None, now, touch):
        return await self._call("search", queries, tenant, k, params, filters, now, touch)

    async def hybrid_search(self, query_vector, lexical_query, tenant, dense_k, lexical_k, params, filters,
                            now) -> ShardHybridResult:
        with MEMORY_HOP.labels("shard_call").time():
            return await self._call("hybrid_search", query_vector, lexical_query, tenant, dense_k, lexical_k, params,
                                    filters, now)

    async def touch(self, ids: Sequence[str], at: Sequence[float]) -> None:
        await self._call("touch", list(ids), list(at))

    async def flush(self) -> None:
        await self._call("flush")

    async def snapshot(self) -> None:
        await self._call("snapshot")

    async def stats(self) -> dict[str, Any]:
        return await self._call("stats")


class HandleMemoryBackend(MemoryService):
    """The memory service (API + ``recallserve.serve.memory.MemoryBackend``) over one generation's handles.

    Args:
        embedder: handle of the generation's :class:`EmbedderDeployment`.
        shards: handles of its shard deployments, shard 0 first.
        memory: ``MemoryConfig`` (top_k, threshold).
        local: the generation's model in this process (``embedder.ingress_max_texts``): calls of at
            most ``local_max_texts`` texts run here and skip the embedder hop; None = every call goes
            to the deployment.

    Example:
        >>> backend = HandleMemoryBackend(embedder_handle, shard_handles, config.memory)
        >>> router = build_router(backend, authenticator)
    """

    def __init__(self, embedder: DeploymentHandle, shards: Sequence[DeploymentHandle], memory: MemoryConfig,
                 local: EmbedLanes | None = None, local_max_texts: int = 0) -> None:
        self._embedder_handle = embedder

        async def embed(texts: list[str]) -> np.ndarray:
            with MEMORY_HOP.labels("embed_call").time():
                if local is not None and len(texts) <= local_max_texts:
                    return await local.embed(list(texts))
                try:
                    return await embedder.embed.remote(list(texts))
                except _FAILURES as exc:
                    raise APIError(503, f"embedder unavailable: {type(exc).__name__}", type="service_unavailable",
                                   code="embedder_unavailable") from exc

        coordinator = MemoryCoordinator([HandleShardClient(h, i) for i, h in enumerate(shards)], calls=memory.calls)
        super().__init__(coordinator, embed, top_k=memory.top_k, threshold=memory.threshold, retrieval=memory.retrieval,
                         admission=SearchAdmission(memory.search_admission))


class LocalEmbedders:
    """The ingress's in-process embedders: one :class:`EmbedLanes` per distinct embedder config.

    Generations (and context-mode and experiences) that use one embedder share one copy of its
    weights; a config with ``ingress_max_texts: 0`` gets none (every embed goes to the deployment).
    """

    def __init__(self) -> None:
        self._lanes: dict[str, EmbedLanes] = {}

    def get(self, cfg: EmbedderConfig | None) -> EmbedLanes | None:
        """The lanes serving ``cfg`` in this process (loaded on first request), or None."""
        if cfg is None or cfg.ingress_max_texts == 0:
            return None
        key = cfg.model_dump_json(exclude={"deployment"})
        if key not in self._lanes:
            self._lanes[key] = EmbedLanes(cfg)
        return self._lanes[key]


def memory_backend(generations: Sequence[dict[str, Any]], memory: MemoryConfig,
                   pii_for: Callable[[str], PiiMode] | None = None,
                   embedder: EmbedderConfig | None = None,
                   local: LocalEmbedders | None = None) -> MemoryService:
    """The ingress's memory service over the bound generations (see :func:`bind_memory`).

    Args:
        generations: ``[{"embedder": handle, "shards": [handle, ...]}, ...]``, the serving
            generation first, then the migration's when ``memory.migration`` is set.
        memory: ``MemoryConfig``.
        pii_for: tenant -> PII policy of its writes (``Authenticator.pii_for``); default: mask.
        embedder: the cluster's embedder config; a generation whose embedder sets
            ``ingress_max_texts`` gets its model loaded in this process for small calls. None =
            every embed goes to the deployments.
        local: the process's in-process embedders, to share with other users of the same model
            (the ingress's context-mode and experiences); None = a registry of its own.
    """
    backend = _memory_backend(generations, memory, embedder, local or LocalEmbedders())
    if pii_for is not None:
        backend.pii_for = pii_for
    return backend


def _memory_backend(generations: Sequence[dict[str, Any]], memory: MemoryConfig,
                    embedder: EmbedderConfig | None, local: LocalEmbedders) -> MemoryService:
    configs = [g.embedder for g in memory.generations(embedder)] if embedder is not None else [None] * len(generations)
    services = [HandleMemoryBackend(g["embedder"], g["shards"], memory, local.get(c), c.ingress_max_texts if c else 0)
                for g, c in zip(generations, configs, strict=True)]
    m = memory.migration
    if len(services) == 1:
        MEMORY_ROUTING.labels(memory.generation or "default", "serving", "true", "true").set(1)
        return services[0]
    if m is None:
        raise ValueError("generations: two were bound but memory.migration is not set")
    MEMORY_ROUTING.labels(memory.generation or "default", "serving", str(m.reads == "current").lower(),
                          str(m.writes == "both").lower()).set(1)
    MEMORY_ROUTING.labels(m.generation, "target", str(m.reads == "target").lower(), "true").set(1)
    return MigratingMemoryService(services[0], services[1], reads=m.reads, writes=m.writes, target_name=m.generation)


def bind_memory(config: AppConfig) -> tuple[Any, list[dict[str, Any]]]:
    """Bound embedder and shard deployments (``serve.deployment`` with the config's options).

    Returns:
        ``(shared embedder, generations)``: the cluster's embedder (context-mode and experiences
        use it) and, per memory generation (serving first, then the migration's), ``{"embedder":
        its embedder, "shards": its shards}``; a generation without its own embedder shares the
        cluster's. The ingress resolves them to handles and builds :func:`memory_backend`.

    Raises:
        ValueError: a shard deployment asked for more than one replica (a shard folder has one
            writer; scale out with ``memory.num_shards`` instead).
    """
    opts = config.deployment_options()
    mem = config.memory
    dep_opts = mem.deployment
    if dep_opts.num_replicas > 1 or (dep_opts.autoscaling is not None and dep_opts.autoscaling.max_replicas > 1):
        raise ValueError(
            "memory.deployment: a shard has a single writer (its WAL); use num_replicas=1 and no autoscaling "
            "above 1 replica, and add shards with memory.num_shards"
        )
    if dep_opts.max_surge_percent > 0:
        raise ValueError(
            "memory.deployment.max_surge_percent: a shard has a single writer (its folder lock), so a successor cannot "
            "start before the old replica stops; keep 0"
        )
    bound: dict[str, Any] = {}

    def embedder(name: str, cfg: EmbedderConfig) -> Any:
        if name not in bound:
            data = cfg.model_dump(mode="json")
            dep = serve.deployment(EmbedderDeployment, name=name).options(**opts[name].to_ray_options())
            # NOTE: its deployment options are Serve's to apply in place, not a reason to restart.
            bound[name] = pin_version(dep, name, {k: v for k, v in data.items() if k != "deployment"}).bind(data)
        return bound[name]

    shared = embedder(EMBEDDER_DEPLOYMENT, config.embedder)
    generations = []
    for gen in mem.generations(config.embedder):
        model_id, dim = embedder_identity(gen.embedder.model)
        data_dir = str(Path(gen.data_dir).expanduser().resolve())
        shards = []
        for i in range(mem.num_shards):
            name = shard_deployment_name(i, gen.name)
            dep = serve.deployment(MemoryShardDeployment, name=name).options(**opts[name].to_ray_options())
            placement = mem.placement.model_dump(mode="json")
            shards.append(pin_version(dep, name, i, data_dir, model_id, dim, placement).bind(i, data_dir, model_id, dim, placement))
        generations.append({"embedder": embedder(gen.embedder_deployment, gen.embedder), "shards": shards})
    return shared, generations
