"""Enrich LoCoMo turns with the cpu-local router model and store the facts in the eval's cache file.

Not part of the serving path. cpu-local's router is the reasoner's llama.cpp model
(qwen2.5-coder-1.5b-instruct-q4_k_m); ``recallserve eval locomo --enrich`` reads the facts of each
turn from the cache this fills, through :class:`recallserve.serve.enrich.FactEnricher`, the code the
``recallserve job enrich`` batch job runs. Windows go in a fixed order (session 1 of every
conversation, then session 2, ...: ``_enrich_locomo.fill_order``), resumable (windows already in the
file are skipped); ``--until HH:MM`` (UTC) stops between calls. Prints one line per call and the
model time per exchange (load excluded) at the end. Results: loadtests/results/locomo-enrich.md.

Usage (from the repo root)::

    nice -n 15 python -m loadtests.locomo_enrich_cost LOCOMO_FILE CACHE.json [--window 4] [--limit N] [--threads 1] [--until 07:35]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import time
from datetime import datetime, timezone

import numpy as np
from recallserve.deployments.cli._enrich_locomo import fill_order
from recallserve.deployments.engines import LlamaCppConfig, build_engine
from recallserve.deployments.models import DEFAULT_MODEL
from recallserve.memory_shards.retrieval.locomo import load_locomo
from recallserve.serve.enrich import EnrichConfig, EnrichmentCache, FactEnricher


def _stop_at(until: str | None) -> float | None:
    if not until:
        return None
    hh, mm = (int(x) for x in until.split(":"))
    now = datetime.now(timezone.utc)
    return now.replace(hour=hh, minute=mm, second=0, microsecond=0).timestamp()


def summary(cache: EnrichmentCache, model: str, window: int | None = None) -> dict:
    """Model time and tokens per exchange over the cache's entries (of one window size, if given)."""
    rows = [e for e in cache.entries.values() if e.get("model") == model and (window is None or len(e["ids"]) == window)]
    per_ex = [e["model_ms"] / len(e["ids"]) for e in rows]
    n_ex = sum(len(e["ids"]) for e in rows)
    facts = [len(f) for e in rows for f in e["facts"]]
    if not rows:
        return {"windows": 0}
    return {"windows": len(rows), "exchanges": n_ex,
            "call_ms_p50": round(float(np.percentile([e["model_ms"] for e in rows], 50)), 1),
            "call_ms_p95": round(float(np.percentile([e["model_ms"] for e in rows], 95)), 1),
            "model_ms_per_exchange_p50": round(float(np.percentile(per_ex, 50)), 1),
            "model_ms_per_exchange_p95": round(float(np.percentile(per_ex, 95)), 1),
            "model_s_total": round(sum(e["model_ms"] for e in rows) / 1000, 1),
            "prompt_tokens_per_exchange": round(sum(e["prompt_tokens"] for e in rows) / n_ex, 1),
            "completion_tokens_per_exchange": round(sum(e["completion_tokens"] for e in rows) / n_ex, 1),
            "facts_per_exchange": round(float(np.mean(facts)), 2),
            "exchanges_without_facts": sum(1 for f in facts if f == 0),
            "failed_calls": sum(1 for e in rows if e["completion_tokens"] == 0)}


async def fill(path: str, cache_path: str, window: int, limit: int | None, threads: int, timeout_s: float,
               until: str | None) -> dict:
    cache = EnrichmentCache(cache_path)
    cfg = EnrichConfig(window=window, timeout_s=timeout_s)
    todo = [(sid, s, w) for sid, s, w in fill_order(load_locomo(path), window)
            if cache.get(DEFAULT_MODEL, w, cfg) is None][:limit]
    stop = _stop_at(until)
    t0 = time.perf_counter()
    engine = build_engine(LlamaCppConfig(n_ctx=2048, n_threads=threads)) if todo else None
    load_s = time.perf_counter() - t0
    asked = 0
    if engine is not None:
        enricher = FactEnricher(engine, cfg)
        for i, (sid, session, w) in enumerate(todo, 1):
            if stop is not None and time.time() >= stop:
                print(f"stopped at {until} UTC before window {i}/{len(todo)}", flush=True)
                break
            got = await enricher(w)
            if not got.failed:  # NOTE: a failed call is asked again by the next run
                cache.put(DEFAULT_MODEL, w, got, cfg)
            asked += 1
            # NOTE: counts only (no content): this output is kept as a log.
            print(f"{i}/{len(todo)} {sid} session {session} {len(w)} turns {got.model_ms:.0f} ms "
                  f"in {got.prompt_tokens} out {got.completion_tokens} tok, facts {[len(f) for f in got.facts]}", flush=True)
        await engine.close()
    return {"model": DEFAULT_MODEL, "threads": threads, "window": window, "load_s": round(load_s, 1),
            "asked_now": asked, "todo": len(todo), **summary(cache, DEFAULT_MODEL, window)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("file")
    p.add_argument("cache")
    p.add_argument("--window", type=int, default=4, help="consecutive turns per call (default 4)")
    p.add_argument("--limit", type=int, default=None)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--timeout", type=float, default=120.0, help="bound of one model call, s (default 120)")
    p.add_argument("--until", default=None, metavar="HH:MM", help="stop between calls at this UTC time")
    a = p.parse_args()
    print(json.dumps(asyncio.run(fill(a.file, a.cache, a.window, a.limit, a.threads, a.timeout, a.until)), indent=1))


if __name__ == "__main__":
    main()
