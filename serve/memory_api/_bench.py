"""Search latency (``main``) and ingestion rate (:func:`ingest_bench`, ``recallserve bench ingest``) of the memory API.

``python -m recallserve.serve.memory_api._bench --memories 100000 --queries 200``

Loads ``--memories`` memories into one tenant of an in-process coordinator of hybrid shards
(written through the coordinator in bulk, WAL fsync off, to save minutes of loading), serves the
real memory router with uvicorn on 127.0.0.1, and times ``POST /v1/memories/search`` (hybrid,
k=16, threshold 0.35) sequentially with httpx: query embedding (MiniLM), the dense fused scan,
BM25, fusion and JSON, as a client sees them.

Memories: LoCoMo turn texts (``--locomo``) each extended with three random words from the
file's vocabulary (so every memory is distinct and posting lists have realistic lengths); their
vectors are the MiniLM vectors of the turn texts plus small Gaussian noise, re-normalised (the
scan cost does not depend on the content, and the noise keeps the dense ranking realistic
without embedding 100k texts on a 2-core machine). Queries are the file's questions.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import platform
import tempfile
import threading
import time

import numpy as np
from recallserve.serve.ports import free_port

__all__ = ["main", "ingest_bench"]


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a JSON row."""
    p = argparse.ArgumentParser(prog="python -m recallserve.serve.memory_api._bench", description=__doc__.splitlines()[0])
    p.add_argument("--memories", type=int, default=100_000, help="memories in the tenant (default 100000)")
    p.add_argument("--queries", type=int, default=200, help="timed searches (default 200)")
    p.add_argument("--warmup", type=int, default=20, help="untimed searches first (default 20)")
    p.add_argument("--shards", type=int, default=2, help="shards (default 2)")
    p.add_argument("--k", type=int, default=16, help="results per search (default 16)")
    p.add_argument("--locomo", default="../shared/eval/locomo_dev.json", help="source of texts and questions")
    p.add_argument("--dense-only", action="store_true", help="hybrid=false in the requests")
    args = p.parse_args(argv)
    if args.memories < 1 or args.queries < 1:
        raise SystemExit("--memories and --queries must be >= 1")

    import httpx
    import uvicorn
    from fastapi import FastAPI

    from recallserve.memory_shards.embedders import build_embedder
    from recallserve.memory_shards.records import EmbeddedRecord, MemoryRecord
    from recallserve.memory_shards.retrieval import local_hybrid_coordinator
    from recallserve.memory_shards.retrieval.locomo import load_locomo
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.api.errors import install_error_handlers
    from recallserve.serve.memory_api import MemoryService, build_router

    convs = load_locomo(args.locomo)
    turns = [t.text for c in convs for t in c.turns if t.text.strip()]
    questions = [q.question for c in convs for q in c.questions]
    vocab = sorted({w for t in turns for w in t.lower().split() if w.isalpha() and len(w) > 3})
    # NOTE: the embedder the CPU profiles serve (ONNX Runtime, fp32 MiniLM, one thread): torch costs ~3x more per query.
    emb = build_embedder("all-MiniLM-L6-v2", runtime="auto")
    base = emb.embed(turns)
    rng = np.random.default_rng(0)
    tmp = tempfile.TemporaryDirectory(prefix="membench-")
    coord = local_hybrid_coordinator(args.shards, emb.model_id, emb.dim, data_root=tmp.name, fsync=False,
                                     snapshot_every_ops=10**9)
    t0 = time.perf_counter()
    batch = 5000
    for start in range(0, args.memories, batch):
        n = min(batch, args.memories - start)
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

    service = MemoryService(coord, embed, top_k=args.k, threshold=0.35)
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
    with httpx.Client(base_url=f"http://127.0.0.1:{port}", headers={"Authorization": "Bearer sk-bench"}, timeout=60) as c:
        for i in range(args.warmup + args.queries):
            body = {"query": questions[i % len(questions)], "k": args.k, "hybrid": not args.dense_only}
            s = time.perf_counter()
            r = c.post("/v1/memories/search", json=body)
            e = time.perf_counter() - s
            r.raise_for_status()
            if i >= args.warmup:
                lat.append(e * 1000)
                sizes.append(len(r.json()["data"]))
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
        "memories_in_tenant": args.memories, "shards": args.shards, "k": args.k, "hybrid": not args.dense_only,
        "queries": args.queries, "load_s": round(load_s, 1),
        "p50_ms": round(float(np.percentile(lat, 50)), 2), "p95_ms": round(float(np.percentile(lat, 95)), 2),
        "mean_ms": round(float(np.mean(lat)), 2), "mean_results": round(float(np.mean(sizes)), 1),
        "shard_stats": stats,
    }
    print(json.dumps(row))
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())


#: single-text query embeddings timed per configuration after the ingest rounds.
_QUERY_SAMPLES = 30


def ingest_bench(configs: list[tuple[str, int, int, str, str]], rounds: int = 8, batch: int = 50,
                 locomo: str = "../shared/eval/locomo_dev.json") -> dict:
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
    import torch
    from fastapi import FastAPI
    from fastapi.testclient import TestClient

    from recallserve.memory_shards.embedders import build_embedder
    from recallserve.memory_shards.retrieval import local_hybrid_coordinator
    from recallserve.memory_shards.retrieval.locomo import load_locomo
    from recallserve.serve import envs
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.api.errors import install_error_handlers
    from recallserve.serve.memory_api import MemoryService, build_router

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
        apps.append((label, threads, TestClient(app), coord, emb))
    questions = [q.question for c in load_locomo(locomo) for q in c.questions][:_QUERY_SAMPLES]
    times: dict[str, list[float]] = {label: [] for label, *_ in configs}
    cpu: dict[str, list[float]] = {label: [] for label, *_ in configs}
    query_ms: dict[str, list[float]] = {label: [] for label, *_ in configs}
    load_before = os.getloadavg()
    cursor = 0
    try:
        for clients in [[a[2].__enter__() for a in apps]]:
            for client, (label, threads, *_) in zip(clients, apps):  # one untimed batch each (first-call costs)
                torch.set_num_threads(threads)
                client.post("/v1/memories", json={"memories": [{"text": "warm up"}]}, headers={"Authorization": "Bearer sk-bench"})
            for _ in range(rounds):
                for client, (label, threads, *_) in zip(clients, apps):
                    torch.set_num_threads(threads)
                    body = {"memories": [{"text": t, "kind": "message"} for t in turns[cursor : cursor + batch]]}
                    cursor += batch
                    t0, c0 = time.perf_counter(), time.process_time()
                    r = client.post("/v1/memories", json=body, headers={"Authorization": "Bearer sk-bench"})
                    times[label].append(time.perf_counter() - t0)
                    cpu[label].append(time.process_time() - c0)
                    if r.status_code != 200 or len(r.json()["ids"]) != batch:
                        raise RuntimeError(f"{label}: POST /v1/memories answered {r.status_code}: {r.text[:200]}")
            # NOTE: the search path embeds one query at a time; a change that helps batches must not slow it.
            for q in questions:
                for label, threads, *_, emb in apps:
                    torch.set_num_threads(threads)
                    t0 = time.perf_counter()
                    emb.embed([q])
                    query_ms[label].append((time.perf_counter() - t0) * 1000)
    finally:
        for _, _, client, coord, _ in apps:
            client.__exit__(None, None, None)
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
    return {"bench": "memory_api_ingest", "server": "in-process FastAPI app (TestClient), 2 hybrid shards, WAL fsync on",
            "machine": platform.node(), "cpus": os.cpu_count(), "python": platform.python_version(),
            "batch": batch, "rounds": rounds, "query_samples": len(questions),
            "load_avg_1m_before_after": [round(load_before[0], 2), round(os.getloadavg()[0], 2)], "rows": rows}
