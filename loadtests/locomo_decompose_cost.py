"""Decompose LoCoMo questions with the cpu-local router model and store them in the eval's cache file.

Not part of the serving path. cpu-local's router is the reasoner's llama.cpp model
(qwen2.5-coder-1.5b-instruct-q4_k_m); ``recallserve eval locomo --decompose`` runs it once per
question through :class:`recallserve.deployments.cli._decompose.QueryDecomposer`, the code the
eval runs. This fills the same cache file ahead of the eval, multi-hop questions first,
resumable (questions already in the file are skipped), and prints the model time per question
(load excluded). Run it under the heavy-work lock. Results: loadtests/results/locomo-decompose.md.

Usage (from the repo root)::

    python -m loadtests.locomo_decompose_cost LOCOMO_FILE CACHE.json [--categories 1,2,3,4] [--limit N] [--threads 2] [--timeout 60]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time

import numpy as np
from recallserve.deployments.cli._decompose import (
    DecomposeConfig,
    DecompositionCache,
    QueryDecomposer,
)
from recallserve.deployments.engines import LlamaCppConfig, build_engine
from recallserve.deployments.models import DEFAULT_MODEL
from recallserve.memory_shards.retrieval.locomo import load_locomo


async def fill(path: str, cache_path: str, categories: list[int], limit: int | None, threads: int,
               timeout_s: float) -> dict:
    cache = DecompositionCache(cache_path)
    convs = load_locomo(path)
    # NOTE: in category order (multi-hop first), so a short run covers the category the option is for.
    questions = list(dict.fromkeys(q.question for cat in categories for c in convs for q in c.questions
                                   if q.category == cat))
    todo = [q for q in questions if cache.get(DEFAULT_MODEL, q) is None][:limit]
    t0 = time.perf_counter()
    engine = build_engine(LlamaCppConfig(n_ctx=1024, n_threads=threads)) if todo else None
    load_s = time.perf_counter() - t0
    ms, tokens = [], []
    if engine is not None:
        # NOTE: a long bound here: the eval measures what the sub-queries bring; the shared cores can stall a call.
        dec = QueryDecomposer(engine, DecomposeConfig(timeout_s=timeout_s))
        for i, q in enumerate(todo, 1):
            d = await dec(q)
            cache.put(DEFAULT_MODEL, q, d)
            ms.append(d.model_ms)
            tokens.append(d.completion_tokens)
            print(f"{i}/{len(todo)} {d.model_ms:.0f} ms {d.queries}", flush=True)
        await engine.close()
    every = [cache.get(DEFAULT_MODEL, q) for q in questions]
    stored = [d for d in every if d is not None]
    all_ms = [d.model_ms for d in stored]
    return {"model": DEFAULT_MODEL, "threads": threads, "load_s": round(load_s, 1), "asked_now": len(todo),
            "questions": len(questions), "cached": len(stored),
            "model_ms_p50": round(float(np.percentile(all_ms, 50)), 1) if all_ms else None,
            "model_ms_p95": round(float(np.percentile(all_ms, 95)), 1) if all_ms else None,
            "completion_tokens_mean": round(float(np.mean([d.completion_tokens for d in stored])), 1) if stored else None,
            "no_subqueries": sum(1 for d in stored if not d.queries),
            "subqueries_mean": round(float(np.mean([len(d.queries) for d in stored])), 2) if stored else None}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("cache")
    p.add_argument("--categories", default="1,2,3,4")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--timeout", type=float, default=60.0, help="bound of one model call, s (default 60)")
    a = p.parse_args()
    cats = [int(x) for x in a.categories.split(",")]
    print(json.dumps(asyncio.run(fill(a.file, a.cache, cats, a.limit, a.threads, a.timeout)), indent=1))


if __name__ == "__main__":
    main()
