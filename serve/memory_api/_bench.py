"""Search latency of the memory API through HTTP at a given size of one tenant.

``python -m serve.memory_api._bench --memories 100000 --queries 200``

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
import platform
import socket
import tempfile
import threading
import time

import numpy as np

__all__ = ["main"]


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def main(argv: list[str] | None = None) -> int:
    """Run the benchmark; print a JSON row."""
    p = argparse.ArgumentParser(prog="python -m serve.memory_api._bench", description=__doc__.splitlines()[0])
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

    from memory_shards.embedders import MiniLMEmbedder
    from memory_shards.records import EmbeddedRecord, MemoryRecord
    from memory_shards.retrieval import local_hybrid_coordinator
    from memory_shards.retrieval.locomo import load_locomo
    from serve.api.auth import Authenticator
    from serve.api.errors import install_error_handlers
    from serve.memory_api import MemoryService, build_router

    convs = load_locomo(args.locomo)
    turns = [t.text for c in convs for t in c.turns if t.text.strip()]
    questions = [q.question for c in convs for q in c.questions]
    vocab = sorted({w for t in turns for w in t.lower().split() if w.isalpha() and len(w) > 3})
    emb = MiniLMEmbedder()
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
    port = _free_port()
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
