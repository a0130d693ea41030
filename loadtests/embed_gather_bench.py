"""Embed calls gathered while a forward pass runs: Ray Serve's ``@serve.batch`` vs ``CallGatherer``.

In process, no Ray cluster: the real MiniLM embedder (the cpu-local settings: 1 thread, 16 texts
per pass) behind each batcher, and ``--clients`` closed-loop callers that each embed one 4-word
query, then spend a random 0..``--gap-ms`` elsewhere (the rest of a search: shards, fusion, HTTP),
so calls arrive one by one, as they do at the embedder replica. Both batchers run with the
cpu-local settings (up to 32 calls per batch, no wait when idle); ``@serve.batch`` with Serve's
default ``max_concurrent_batches=1``. Modes alternate ``--rounds`` times, same seed.

Reports per mode: embed calls/s, mean calls per forward, p50 / p95 call latency (ms), and the
ratio of the gatherer's calls/s to ``@serve.batch``'s measured in the same run.

NOTE: ``@serve.batch`` reads the replica's ``max_ongoing_requests`` through
``recallserve.serve.get_replica_context()``, which exists only inside a replica; the benchmark supplies that
one value (64) so the decorator runs unchanged in process.

Example::

    nice -n 10 python -m loadtests.embed_gather_bench --clients 16 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import types
from pathlib import Path
from typing import Any

import numpy as np

_WORDS = "printer fuse order ticket refund courier invoice battery screen laptop delivery warranty".split()


def _serve_batch_embedder(embed, sizes: list[int]):
    from ray import serve

    serve.get_replica_context = lambda: types.SimpleNamespace(  # see the module NOTE
        _deployment_config=types.SimpleNamespace(max_ongoing_requests=64))

    class Embedder:
        @serve.batch(max_batch_size=32, batch_wait_timeout_s=0)
        async def batch(self, requests: list[list[str]]) -> list[np.ndarray]:
            sizes.append(len(requests))
            vectors = await asyncio.to_thread(embed, [t for r in requests for t in r])
            return [vectors[i : i + 1] for i in range(len(requests))]

    return Embedder().batch


def _gathered_embedder(embed, sizes: list[int]):
    from recallserve.memory_shards import CallGatherer

    async def forward(requests: list[list[str]]) -> list[np.ndarray]:
        sizes.append(len(requests))
        vectors = await asyncio.to_thread(embed, [t for r in requests for t in r])
        return [vectors[i : i + 1] for i in range(len(requests))]

    return CallGatherer(forward, max_items=32).submit


async def _level(call, clients: int, seconds: float, gap_s: float, seed: int) -> list[float]:
    rng = random.Random(seed)
    stop = time.perf_counter() + seconds
    latencies: list[float] = []

    async def client() -> None:
        await asyncio.sleep(rng.uniform(0, gap_s))
        while time.perf_counter() < stop:
            t0 = time.perf_counter()
            await call([" ".join(rng.choice(_WORDS) for _ in range(4))])
            latencies.append(time.perf_counter() - t0)
            await asyncio.sleep(rng.uniform(0, gap_s))

    await asyncio.gather(*(client() for _ in range(clients)))
    return latencies


def run(clients: int, seconds: float, gap_ms: float, rounds: int, seed: int) -> dict[str, Any]:
    """Alternate the two modes ``rounds`` times; figures summed over rounds per mode."""
    from recallserve.memory_shards import build_embedder

    emb = build_embedder("all-MiniLM-L6-v2", device="cpu", batch_size=16, torch_threads=1)
    emb.embed(["warm up"])
    out: dict[str, dict[str, Any]] = {}
    for r in range(rounds):
        for mode, make in (("serve_batch", _serve_batch_embedder), ("gathered", _gathered_embedder)):
            sizes: list[int] = []
            call = make(emb.embed, sizes)
            t0 = time.perf_counter()
            lat = asyncio.run(_level(call, clients, seconds, gap_ms / 1e3, seed + r))
            wall = time.perf_counter() - t0
            acc = out.setdefault(mode, {"calls": 0, "wall_s": 0.0, "forwards": 0, "lat": []})
            acc["calls"] += len(lat)
            acc["wall_s"] += wall
            acc["forwards"] += len(sizes)
            acc["lat"] += lat
    report: dict[str, Any] = {"clients": clients, "seconds": seconds, "gap_ms": gap_ms, "rounds": rounds, "modes": {}}
    for mode, acc in out.items():
        ms = np.array(acc["lat"]) * 1e3
        report["modes"][mode] = {
            "calls_per_s": round(acc["calls"] / acc["wall_s"], 2),
            "mean_batch": round(acc["calls"] / max(1, acc["forwards"]), 2),
            "p50_ms": round(float(np.percentile(ms, 50)), 1), "p95_ms": round(float(np.percentile(ms, 95)), 1),
        }
    m = report["modes"]
    report["gathered_vs_serve_batch"] = round(m["gathered"]["calls_per_s"] / m["serve_batch"]["calls_per_s"], 2)
    return report


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--clients", type=int, default=16, help="concurrent callers (1-256)")
    ap.add_argument("--seconds", type=float, default=8.0, help="seconds per mode and round (1-120)")
    ap.add_argument("--gap-ms", type=float, default=40.0, help="most ms a caller spends between embed calls (0-1000)")
    ap.add_argument("--rounds", type=int, default=2, help="alternations of the two modes (1-10)")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--out", type=Path, default=None, help="JSON output")
    a = ap.parse_args(argv)
    if not (1 <= a.clients <= 256 and 1 <= a.seconds <= 120 and 0 <= a.gap_ms <= 1000 and 1 <= a.rounds <= 10):
        ap.error("--clients 1-256, --seconds 1-120, --gap-ms 0-1000, --rounds 1-10")
    report = run(a.clients, a.seconds, a.gap_ms, a.rounds, a.seed)
    text = json.dumps(report, indent=2)
    print(text)
    if a.out is not None:
        a.out.write_text(text + "\n")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
