"""The ingress deployment: the FastAPI app, built on each replica from the cluster config.

``serve.ingress()`` with no app defers the app to :meth:`Ingress.__serve_build_asgi_app__`,
which runs on the replica after ``__init__`` received the resolved deployment handles; the
routes themselves are the framework-free ones of ``recallserve.serve.api``, ``recallserve.serve.memory_api`` and
``recallserve.serve.experience``, and the pipeline (context-mode, agent, experiences) is plain ``serve``.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Sequence
from typing import Any, cast

import numpy as np

from fastapi import FastAPI
from ray.serve.handle import DeploymentHandle

from recallserve.deployments._placement import PlacementInfo
from recallserve.deployments.config import ROLES, AppConfig
from recallserve.deployments.engines import EngineConfig, LlamaCppConfig, VLLMConfig
from recallserve.deployments.handles import HandleEngine, on_data_plane
from recallserve.deployments.memory import EmbedLanes, LocalEmbedders, memory_backend
from recallserve.deployments.state import RemoteStore, open_state_stores, remote_state_stores
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import RESERVED_TENANT_PREFIX, Authenticator
from recallserve.serve.agent import Agent, default_registry
from recallserve.serve.agent.demo import load_demo_memories
from recallserve.serve.context import ContextManager, LLMSummariser
from recallserve.serve.context import build_router as build_session_router
from recallserve.serve.erasure import ErasureLog, ErasureService, OwnedStore
from recallserve.serve.erasure import build_router as build_erasure_router
from recallserve.serve.experience import ExperienceService
from recallserve.serve.experience import build_router as build_experience_router
from recallserve.serve.memory_api import MemoryService, SearchRequest
from recallserve.serve.memory_api import build_router as build_memory_router
from recallserve.serve.tokens import EngineTokenCounter
from recallserve.serve.traces import TraceRecorder
from recallserve.serve.traces import build_router as build_turn_router
from recallserve.serve.console import build_console_router, tenant_records
from recallserve.serve.pipeline import ChatPipeline

#: Seconds between an erasure's two passes on the cluster (see ErasureService.settle_s).
ERASURE_SETTLE_S = 20.0
#: How often each ingress replica looks for unfinished erasures whose runner's lease ran out.
ERASURE_POLL_S = 30.0
#: A run's claim on an erasure (renewed before each pass: longer than a pass plus ERASURE_SETTLE_S).
ERASURE_LEASE_S = 120.0

__all__ = ["WARM_UP_TENANT", "Ingress", "build_ingress_app", "engine_facts"]

#: The tenant of the start-up recall; no API key maps to it (``RESERVED_TENANT_PREFIX``).
WARM_UP_TENANT = f"{RESERVED_TENANT_PREFIX}warm_up__"

log = logging.getLogger("recallserve.ingress")


def _sync_embed(embedder: DeploymentHandle, local: EmbedLanes | None = None,
                local_max_texts: int = 0) -> Callable[[Sequence[str]], np.ndarray]:
    """A blocking embed function: calls of at most ``local_max_texts`` texts run on the ingress's
    own copy of the model (``embedder.ingress_max_texts``, as the memory API's queries do), the rest
    on the embedder deployment.

    Context-mode and experiences call it from a worker thread (``asyncio.to_thread``), where
    waiting on a handle's result is allowed; it must never be called on the replica's event loop.
    """

    def embed(texts: Sequence[str]) -> np.ndarray:
        if local is not None and len(texts) <= local_max_texts:
            return local.embed_blocking(texts)
        return np.asarray(embedder.embed.remote(list(texts)).result(timeout_s=60), dtype=np.float32)

    return embed


def engine_facts(engine: EngineConfig) -> tuple[str, int]:
    """(model name, context window) of an engine config, known without loading the model."""
    if isinstance(engine, LlamaCppConfig):
        return engine.model.display_name, engine.n_ctx
    if isinstance(engine, VLLMConfig):
        name = engine.served_model_name or engine.model.display_name
        # NOTE: 4096 is a conservative context when max_model_len is left to the model.
        return name, engine.max_model_len or 4096
    return engine.model, engine.context_window


class Ingress(PlacementInfo):
    """Body of the ingress deployment: builds the FastAPI app on the replica.

    Ray Serve calls ``__serve_build_asgi_app__`` after ``__init__`` (``serve.ingress()`` with no
    app), so the routes are built with the real deployment handles this replica was bound to.
    """

    def __init__(self, config_data: dict[str, Any], roles: dict[str, DeploymentHandle],
                 memory: dict[str, Any], state: DeploymentHandle | None) -> None:
        self.config = AppConfig.model_validate(config_data)
        grpc = self.config.ray.throughput_optimized
        self.roles = on_data_plane(roles, grpc)
        self.memory = on_data_plane(memory, grpc)
        # NOTE: None with state_db.dsn_env: this replica opens its own pool to PostgreSQL.
        self.state = None if state is None else on_data_plane(state, grpc)

    def __serve_build_asgi_app__(self) -> FastAPI:
        app, self._backend = build_ingress_app(self.config, self.roles, self.memory, self.state)
        return app

    async def memory_routing(self) -> dict[str, Any]:
        """The memory generations this replica writes and reads (``reembed --live`` checks it)."""
        m = self.config.memory.migration
        return {"generation": self.config.memory.generation, "migration": None if m is None else m.model_dump(mode="json")}

    async def load_demo(self) -> int:
        """Write the demo world's manual and past tickets as shared memories; returns the count.

        Used by ``recallserve up --demo``: shared records are visible to every tenant, and an API
        key can only write its own tenant's records, so this goes through a handle, not HTTP.
        """
        return len(await load_demo_memories(self._backend))


def build_ingress_app(config: AppConfig, roles: dict[str, DeploymentHandle],
                      memory: dict[str, Any], state: DeploymentHandle | None) -> tuple[FastAPI, MemoryService]:
    """Build the ingress FastAPI app (and its memory backend) from the config and the handles.

    Args:
        config: the cluster config.
        roles: handles of the router, reasoner and summariser deployments.
        memory: ``{"embedder": handle, "generations": [{"embedder": handle, "shards": [handle, ...]}, ...]}``
            (the cluster's embedder, then each memory generation, serving first; see ``bind_memory``).
        state: handle of the state deployment (sessions, experiences and traces in SQLite, shared by
            every replica); None when ``config.state_db`` names a PostgreSQL DSN: then this replica
            opens its own pool to the database (no single replica on the path).
    """
    auth = Authenticator(config.auth.resolve(), config.auth.scopes, config.auth.default_scopes,
                         pii=config.auth.pii, default_pii=config.auth.default_pii,
                         retention={t: r.model_dump() for t, r in config.auth.retention.items()},
                         admins=config.auth.admin_tenants)
    local = LocalEmbedders()
    backend = memory_backend(memory["generations"], config.memory, pii_for=auth.pii_for, embedder=config.embedder,
                             local=local)
    embed = _sync_embed(memory["embedder"], local.get(config.embedder), config.embedder.ingress_max_texts)
    engines = {role: HandleEngine(roles[role], role, *engine_facts(getattr(config, role).engine)) for role in ROLES}
    if state is None:
        db_config = config.state_db
        stores, db = open_state_stores(db_config.resolve(), config.traces, pool_size=db_config.pool_size,
                                       acquire_timeout_s=db_config.acquire_timeout_s)
        # NOTE: the one erasure log of the cluster is a table of the same database (every replica).
        erasure_log = ErasureLog(db=db)
    else:
        # NOTE: RemoteStore has each store's async methods, each run on the one state replica.
        stores = remote_state_stores(state)
        erasure_log = cast(ErasureLog, RemoteStore(state, "erasures"))
    context = ContextManager(
        stores.sessions,
        config.context,
        counter=EngineTokenCounter(engines["reasoner"]),
        embed=embed,
        summariser=LLMSummariser(engines["summariser"]),
        pii_for=auth.pii_for,
    )
    agent = None
    if config.agent_enabled:
        agent = Agent(engines["reasoner"], default_registry(demo=config.agent_demo_tools), router=engines["router"],
                      memory=backend, config=config.agent, recall=config.chat.recall)
    experiences = ExperienceService(config.experience.model_copy(update={"data_dir": config.state_dir / "experiences"}),
                                    embed, memory=backend,
                                    store=stores.experiences,
                                    pii_for=auth.pii_for, rewriter=engines["router"])
    # NOTE: one trace store for every replica, where the sessions are.
    traces = TraceRecorder(stores.turns, config.traces)
    erasure = ErasureService(erasure_log, backend.coordinators(), {
        "sessions": cast(OwnedStore, stores.sessions), "experiences": cast(OwnedStore, stores.experiences),
        "turns": cast(OwnedStore, stores.turns)},
        caches=[agent.cache.clear] if agent is not None else [],
        # NOTE: a second pass 20 s after the first catches the background append, trace and write-back
        # of a turn answered just before the erasure, inside the 60 s target; a turn still generating
        # for longer is not waited for (docs/erasure.md says so).
        settle_s=ERASURE_SETTLE_S, lease_s=ERASURE_LEASE_S)
    pipeline = ChatPipeline(reasoner=engines["reasoner"], settings=config.chat, memory=backend, context=context,
                            agent=agent, experiences=experiences, traces=traces, erased=erasure.erased_since)

    async def health() -> dict[str, Any]:
        return {"profile": config.profile, "roles": {r: engines[r].model_name for r in ROLES}}

    async def warm_up() -> None:
        # NOTE: the first call of each handle (embedder, every shard, state) and the embedder's first
        # forward pass are slow; one recall for a tenant no key maps to, and one state call, pay them
        # here (first turn's memory step: 506 ms -> 125 ms). create_app waits for this hook (up to
        # chat.warm_up_wait_s) before the replica reports ready: started but not awaited, the first
        # user turn queued behind the reasoner warm-up below (25-35 s for "Name one colour." after
        # `recallserve up`, 2.5 s of it in the engine).
        start = time.perf_counter()
        try:
            # NOTE: the Chinese word loads the dictionary of Chinese queries' English glosses (~1-2 s, once)
            await backend.search_request(WARM_UP_TENANT, SearchRequest(query="warm up the recall path 预热", k=1),
                                         caller="warm_up")
            await traces.store.count(WARM_UP_TENANT)
            log.info("recall path and state warmed in %.1f s", time.perf_counter() - start)
        except Exception as exc:  # noqa: BLE001 - a cold path is slower, not broken; the answer says why
            log.warning("warm-up of the recall path failed (first turn will be slower): %s", exc)
        # NOTE: fills the reasoner's prompt cache with the agent's stable prefix (system prompt +
        # tool list) so the first user does not pay its whole prefill.
        if agent is not None:
            seconds = await agent.warm_up(config.auth.default_scopes)
            log.info("agent prompt prefix warmed in %.1f s", seconds)

    async def resume_erasures() -> None:
        # NOTE: every ingress replica polls the one log; a lease gives each unfinished erasure to
        # one replica at a time, and a dead runner's lease runs out for another one to take over.
        started = await erasure.resume()
        if started:
            log.info("resumed %d unfinished erasures", started)
        background.add(asyncio.get_running_loop().create_task(erasure.poll(ERASURE_POLL_S)))

    background: set[asyncio.Task[None]] = set()

    app = create_app(pipeline, auth, health=health, on_startup=[warm_up, resume_erasures],
                     startup_wait_s=config.chat.warm_up_wait_s,
                     routers=[build_memory_router(backend, auth), build_experience_router(experiences, auth),
                              build_session_router(context, auth), build_turn_router(traces.store, auth),
                              build_console_router(auth, tenant_records(backend.coordinator.stats)),
                              build_erasure_router(erasure, auth)])
    return app, backend
