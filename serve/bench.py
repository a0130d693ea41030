"""The serve layer's benchmarks, in process (no Ray): the real routers and services behind FastAPI.

* :func:`api_search_bench` (``recallserve bench api-search``): latency of ``POST /v1/memories/search``
  through uvicorn on 127.0.0.1;
* :func:`ingest_bench` (``recallserve bench ingest``): memories/s of ``POST /v1/memories`` per
  embedder configuration;
* :func:`verify_bench` (``recallserve bench verify``): what hostile experience records cost the
  other requests of one ingress replica.

Each returns JSON-ready figures; the command-line front ends (arguments, tables, files) are in
``recallserve.deployments.cli``. Texts and questions come from a LoCoMo-format file the caller
names (none ships with the repository).

Search latency: loads ``memories`` memories into one tenant of an in-process coordinator of
hybrid shards (written through the coordinator in bulk, WAL fsync off, to save minutes of
loading), serves the real memory router with uvicorn on 127.0.0.1, and times
``POST /v1/memories/search`` (hybrid, k=16, threshold 0.35) sequentially with ``recallserve.client``
(``memories.search``, retries off): query embedding (MiniLM), the dense fused scan, BM25, fusion,
JSON and the client reading the answer into ``SearchResponse``, as a client sees them.
Memories: LoCoMo turn texts each extended with three random words from the file's vocabulary (so
every memory is distinct and posting lists have realistic lengths); their vectors are the MiniLM
vectors of the turn texts plus small Gaussian noise, re-normalised (the scan cost does not depend
on the content, and the noise keeps the dense ranking realistic without embedding 100k texts on
a 2-core machine). Queries are the file's questions.
"""

from __future__ import annotations

import asyncio
import os
import platform
import statistics
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import torch
import uvicorn
from fastapi import FastAPI

from recallserve.client import AsyncRecallServe, RecallServe, RecallServeError, RetryPolicy
from recallserve.memory_shards import HashingEmbedder
from recallserve.memory_shards.embedders import build_embedder
from recallserve.memory_shards.records import EmbeddedRecord, MemoryRecord
from recallserve.memory_shards.retrieval import local_hybrid_coordinator
from recallserve.memory_shards.retrieval.locomo import load_locomo
from recallserve.serve import envs
from recallserve.serve.api.app import create_app
from recallserve.serve.api.auth import Authenticator
from recallserve.serve.api.errors import install_error_handlers
from recallserve.serve.engine import LLMEngine
from recallserve.serve.experience import ExperienceConfig, ExperienceService, verify_record
from recallserve.serve.experience import build_router as build_experience_router
from recallserve.serve.memory_api import MemoryService, build_router
from recallserve.serve.pipeline import ChatPipeline
from recallserve.serve.ports import free_port

__all__ = ["api_search_bench", "hostile_record", "ingest_bench", "verify_bench"]

#: A bench times each answer as the server gave it: no retry hides a refusal (an error raises).
NO_RETRY = RetryPolicy(max_retries=0)


def api_search_bench(locomo: str, memories: int = 100_000, queries: int = 200, warmup: int = 20, shards: int = 2,
                     k: int = 16, hybrid: bool = True) -> dict[str, Any]:
    """Latency of ``POST /v1/memories/search`` over ``memories`` memories of one tenant (see the module docstring).

    Args:
        locomo: a LoCoMo-format JSON file: the source of texts and questions.
        memories: memories in the tenant.
        queries: timed searches, one at a time; ``warmup`` untimed ones first.
        shards: hybrid shards of the coordinator.
        k: results per search.
        hybrid: dense + BM25 (False: ``hybrid: false`` in the requests).

    Raises:
        ValueError: ``memories`` or ``queries`` below 1.
    """
    if memories < 1 or queries < 1:
        raise ValueError(f"memories and queries must be >= 1, got {memories} and {queries}")

    convs = load_locomo(locomo)
    turns = [t.text for c in convs for t in c.turns if t.text.strip()]
    questions = [q.question for c in convs for q in c.questions]
    vocab = sorted({w for t in turns for w in t.lower().split() if w.isalpha() and len(w) > 3})
    # NOTE: the embedder the CPU profiles serve (ONNX Runtime, fp32 MiniLM, one thread): torch costs ~3x more per query.
    emb = build_embedder("all-MiniLM-L6-v2", runtime="auto")
    base = emb.embed(turns)
    rng = np.random.default_rng(0)
    tmp = tempfile.TemporaryDirectory(prefix="membench-")
    coord = local_hybrid_coordinator(shards, emb.model_id, emb.dim, data_root=tmp.name, fsync=False,
                                     snapshot_every_ops=10**9)
    t0 = time.perf_counter()
    batch = 5000
    for start in range(0, memories, batch):
        n = min(batch, memories - start)
        pick = rng.integers(0, len(turns), n)
        # NOTE: noise 0.02 per dim (~0.4 in norm before re-normalising) keeps copies of one turn apart.
        vecs = base[pick] + rng.normal(0, 0.02, (n, emb.dim)).astype(np.float32)
        vecs /= np.linalg.norm(vecs, axis=1, keepdims=True)
        items = []
        for j in range(n):
            extra = " ".join(rng.choice(vocab, 3))
            rec = MemoryRecord(tenant="bench", source_id=f"m{start + j}", kind="message", text=f"{turns[pick[j]]} {extra}",
                               created_at=1.7e9 + start + j)
            items.append(EmbeddedRecord(rec, vecs[j : j + 1]))
        asyncio.run(coord.upsert(items))
    load_s = time.perf_counter() - t0

    async def embed(texts: list[str]):
        return await asyncio.to_thread(emb.embed, texts)

    service = MemoryService(coord, embed, top_k=k, threshold=0.35)
    app = FastAPI()
    install_error_handlers(app)
    app.include_router(build_router(service, Authenticator({"sk-bench": "bench"})))
    port = free_port()
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    while not server.started:
        time.sleep(0.05)
    lat, sizes = [], []
    with RecallServe(f"http://127.0.0.1:{port}", "sk-bench", timeout=60, retry=NO_RETRY) as c:
        for i in range(warmup + queries):
            s = time.perf_counter()
            found = c.memories.search(questions[i % len(questions)], k=k, hybrid=hybrid)
            e = time.perf_counter() - s
            if i >= warmup:
                lat.append(e * 1000)
                sizes.append(len(found.data))
    server.should_exit = True
    thread.join(timeout=10)
    stats = asyncio.run(coord.stats())
    for client in coord.shards:
        client.shard.close()
    tmp.cleanup()
    row = {
        "bench": "memory_api_search_http",
        "server": "in-process FastAPI app, uvicorn on 127.0.0.1 (not Ray Serve)",
        "machine": platform.node(), "python": platform.python_version(),
        "memories_in_tenant": memories, "shards": shards, "k": k, "hybrid": hybrid,
        "queries": queries, "load_s": round(load_s, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2), "p95_ms": round(float(np.percentile(lat, 95)), 2),
        "mean_ms": round(float(np.mean(lat)), 2), "mean_results": round(float(np.mean(sizes)), 1),
        "shard_stats": stats,
    }
    return row


#: single-text query embeddings timed per configuration after the ingest rounds.
_QUERY_SAMPLES = 30


def ingest_bench(configs: list[tuple[str, int, int, str, str]], rounds: int = 8, batch: int = 50, *,
                 locomo: str) -> dict:
    """Memories/s of ``POST /v1/memories`` (batches of ``batch``) per embedder configuration, interleaved.

    Each configuration ``(label, texts per forward pass, threads, embedder model name, runtime)`` gets
    its own in-process app (the real router, service, hybrid shards on disk with fsync'ed WAL, the
    embedder as ``build_embedder`` makes it for the deployment); the rounds
    alternate between configurations so that load from other processes hits them alike. Texts
    are distinct LoCoMo turns (never the same text twice). The first configuration is the
    baseline of the ``ratio`` column. Median and best batch times are reported, and the median
    CPU seconds of the process per batch (all its threads: ``time.process_time``): on cores shared
    with other work the wall time says how big this process's share was, the CPU time what a
    batch costs (``memories_per_cpu_s`` = memories/s on one whole core). ONNX files are exported
    into ``$RECALLSERVE_HOME/onnx`` (as the deployment does) before timing starts.
    """
    turns = list(dict.fromkeys(t.text for c in load_locomo(locomo) for t in c.turns if t.text.strip()))
    need = batch * rounds * len(configs)
    if len(turns) < need:
        raise ValueError(f"rounds: {rounds} rounds x {len(configs)} configs x {batch} need {need} turns, the file has {len(turns)}")
    tmp = tempfile.TemporaryDirectory(prefix="ingest-bench-")
    apps = []
    for i, (label, fwd, threads, model, runtime) in enumerate(configs):
        # NOTE: torch threads are process-wide (set before each timed batch below); an ONNX session
        # has its own thread pool, fixed here.
        emb = build_embedder(model, batch_size=fwd, torch_threads=threads if runtime == "onnx" else None,
                             runtime=runtime, cache_dir=envs.recallserve_home() / "onnx")
        emb.embed(["warm up"])
        coord = local_hybrid_coordinator(2, emb.model_id, emb.dim, data_root=f"{tmp.name}/{i}")

        async def embed(texts: list[str], emb=emb):
            return await asyncio.to_thread(emb.embed, texts)

        app = FastAPI()
        install_error_handlers(app)
        app.include_router(build_router(MemoryService(coord, embed), Authenticator({"sk-bench": "bench"})))
        apps.append((label, threads, app, coord, emb))
    questions = [q.question for c in load_locomo(locomo) for q in c.questions][:_QUERY_SAMPLES]
    times: dict[str, list[float]] = {label: [] for label, *_ in configs}
    cpu: dict[str, list[float]] = {label: [] for label, *_ in configs}
    query_ms: dict[str, list[float]] = {label: [] for label, *_ in configs}
    load_before = os.getloadavg()
    try:
        asyncio.run(_ingest_rounds(apps, turns, rounds, batch, times, cpu))
        # NOTE: the search path embeds one query at a time; a change that helps batches must not slow it.
        for q in questions:
            for label, threads, *_, emb in apps:
                torch.set_num_threads(threads)
                t0 = time.perf_counter()
                emb.embed([q])
                query_ms[label].append((time.perf_counter() - t0) * 1000)
    finally:
        for _, _, _, coord, _ in apps:
            for shard in coord.shards:
                shard.shard.close()
        tmp.cleanup()
    base = float(np.median(times[configs[0][0]]))
    rows = []
    for label, fwd, threads, model, runtime in configs:
        med = float(np.median(times[label]))
        cpu_med = float(np.median(cpu[label]))
        rows.append({"config": label, "forward_batch_size": fwd, "threads": threads, "model": model, "runtime": runtime,
                     "batches": len(times[label]),
                     "median_batch_s": round(med, 3), "best_batch_s": round(min(times[label]), 3),
                     "memories_per_s": round(batch / med, 1), "best_memories_per_s": round(batch / min(times[label]), 1),
                     "ratio_vs_baseline": round(base / med, 2),
                     "median_cpu_s_per_batch": round(cpu_med, 3),
                     "memories_per_cpu_s": round(batch / cpu_med, 1) if cpu_med > 0 else None,
                     "query_embed_p50_ms": round(float(np.median(query_ms[label])), 1) if query_ms[label] else None})
    return {"bench": "memory_api_ingest",
            "server": "in-process FastAPI app (recallserve.client over httpx's ASGI transport), 2 hybrid shards, WAL fsync on",
            "machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "batch": batch, "rounds": rounds, "query_samples": len(questions),
            "load_avg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)], "rows": rows}


async def _ingest_rounds(apps: list[tuple[str, int, FastAPI, Any, Any]], turns: list[str], rounds: int, batch: int,
                         times: dict[str, list[float]], cpu: dict[str, list[float]]) -> None:
    """``rounds`` x one batch per app (interleaved), through the client; wall and CPU seconds per batch into
    ``times`` / ``cpu`` by label. One untimed batch each first (first-call costs)."""
    clients = [AsyncRecallServe("http://bench", "sk-bench", transport=httpx.ASGITransport(app=app), retry=NO_RETRY)
               for _, _, app, _, _ in apps]
    cursor = 0
    try:
        for client, (label, threads, *_) in zip(clients, apps):
            torch.set_num_threads(threads)
            await client.memories.add([{"text": "warm up"}])
        for _ in range(rounds):
            for client, (label, threads, *_) in zip(clients, apps):
                torch.set_num_threads(threads)
                memories = [{"text": t, "kind": "message"} for t in turns[cursor : cursor + batch]]
                cursor += batch
                t0, c0 = time.perf_counter(), time.process_time()
                try:
                    added = await client.memories.add(memories)
                except RecallServeError as exc:
                    raise RuntimeError(f"{label}: POST /v1/memories answered {exc}") from None
                times[label].append(time.perf_counter() - t0)
                cpu[label].append(time.process_time() - c0)
                if len(added.ids) != batch:
                    raise RuntimeError(f"{label}: POST /v1/memories stored {len(added.ids)} of {batch}")
    finally:
        for client in clients:
            await client.aclose()


# --- verify: hostile experience records beside ordinary requests -------------------------------
# Verification of an experience record is capped per step and per record and runs in a worker
# process (``verify_workers``): one record whose check computed ``round(5, -10**7)`` once held
# the ingress event loop for 6 s. This times ordinary requests (``GET /healthz`` and the
# authenticated ``GET /v1/models``), sequentially, in the real ingress app (``create_app`` with the
# experience router; the engine is never called, nothing listens on a port): alone; while one
# client posts hostile records back to back; while ``posters`` clients do, with verification in the
# worker process (as shipped), in a thread of the replica (``verify_workers: 0``) and on the event
# loop (the ablation: what moving it off buys). The worker process is started (and the first
# record verified) before timing, so its one-off spawn is not charged to the probes.

# NOTE: each hits one cap of the calculator or the operand checks (see serve.experience._verify).
_HOSTILE = ["round(5, -10**7)", "10**10**10", "9**9**9", "(10**300)**1000", "factorial(10**6)",
            "(" * 240 + "1" + ")" * 240, "-" * 300 + "1", "9" * 400, "x ** x ** x = 1"]
# NOTE: a legal expression near the 200-node cap: 32 of them are what spends a record's budget.
_HEAVY = " + ".join(["d * 2 - d / 4"] * 12)


def hostile_record() -> dict[str, Any]:
    """A record of 32 checks: every cap, then legal checks heavy enough to spend the budget."""
    checks: list[dict[str, Any]] = [{"type": "recomputation", "target": t[:1000], "expected": "1",
                                     "input": {"x": 9}} for t in _HOSTILE]
    checks += [{"type": "recomputation", "target": _HEAVY, "expected": "1"}] * (32 - len(checks))
    return {
        "metadata": {"source_model": "bench", "task_domain": "units", "topic": "bench/hostile"},
        "context": {"raw_text": "hostile verification", "quantities": [{"name": "d", "value": 120, "unit": "km"}]},
        "reasoning": [{"step_id": 1, "text": "compute"}],
        "verification": checks,
        "outcome": {"answer": "1"},
    }


class _VerifyOnLoop(ExperienceService):
    """The ablation: verification on the event loop (caps still on)."""

    async def _verify(self, tenant: str, record: Any, required: Any) -> Any:
        return verify_record(record, self.rules, required=required)


def _verify_app(data_dir: Path, mode: str, engine: LLMEngine) -> tuple[Any, ExperienceService]:
    emb = HashingEmbedder(384)
    config = ExperienceConfig(data_dir=data_dir, verify_workers=1 if mode == "process" else 0)
    service = (_VerifyOnLoop if mode == "loop" else ExperienceService)(config, emb.embed)
    auth = Authenticator({"sk-bench": "bench"})
    return create_app(ChatPipeline(engine), auth, routers=[build_experience_router(service, auth)]), service


async def _post_hostile(client: AsyncRecallServe, record: dict[str, Any]) -> None:
    """Post ``record``; its refusal (4xx: a check over a cap) is an answer, a 5xx a failed bench."""
    try:
        await client.experiences.create(record)
    except RecallServeError as exc:
        if exc.status >= 500 or exc.status == 0:
            raise RuntimeError(f"hostile record answered {exc}") from None


async def _verify_measure(app: Any, probes: int, posters: int) -> dict[str, float]:
    record = hostile_record()
    posted: list[float] = []
    stop = asyncio.Event()
    async with AsyncRecallServe("http://bench", "sk-bench", transport=httpx.ASGITransport(app=app), retry=NO_RETRY) as client:

        async def poster() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                await _post_hostile(client, record)
                posted.append(time.perf_counter() - start)

        if posters:  # NOTE: warm-up: starts the verification worker outside the timed window
            await _post_hostile(client, record)
        tasks = [asyncio.create_task(poster()) for _ in range(posters)]
        await asyncio.sleep(0.2 if posters else 0)  # NOTE: let the posters reach steady state
        latencies = []
        for i in range(probes):
            start = time.perf_counter()
            # NOTE: an error answer raises (RecallServeError): an ordinary request must be answered 200.
            await (client.health() if i % 2 == 0 else client.models())
            latencies.append(time.perf_counter() - start)
            await asyncio.sleep(0.005)  # NOTE: a client's think time, so posters get the loop too
        stop.set()
        await asyncio.gather(*tasks)
    q = statistics.quantiles(latencies, n=20)
    out = {"posters": posters, "p50_ms": 1e3 * statistics.median(latencies), "p95_ms": 1e3 * q[18],
           "hostile_posts": len(posted)}
    if posted:
        out["hostile_post_p50_ms"] = 1e3 * statistics.median(posted)
    return out


def verify_bench(engine: LLMEngine, probes: int = 300, posters: int = 4) -> dict[str, dict[str, float]]:
    """p50 / p95 of ordinary requests per run (see the comment above), keyed by the run's name.

    Args:
        engine: the app's chat engine; never called (the timed routes do not reach it).
        probes: ordinary requests per run (>= 20: the p95 needs them).
        posters: concurrent clients posting hostile records.

    Raises:
        ValueError: ``probes`` below 20 or ``posters`` below 1.
    """
    if probes < 20 or posters < 1:
        raise ValueError(f"probes must be >= 20 and posters >= 1, got {probes} and {posters}")
    results = {}
    for name, mode, n in [("alone", "process", 0), ("one hostile record at a time, worker process", "process", 1),
                          ("hostile posts, worker process", "process", posters),
                          ("hostile posts, worker thread", "thread", posters),
                          ("hostile posts, on the loop (ablation)", "loop", posters)]:
        with tempfile.TemporaryDirectory(prefix="rs-verify-bench-") as tmp:
            app, service = _verify_app(Path(tmp), mode, engine)
            try:
                results[name] = asyncio.run(_verify_measure(app, probes, n))
            finally:
                service.close()
    return results
