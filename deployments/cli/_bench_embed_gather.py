"""``recallserve bench embed-gather``: embed calls gathered while a forward pass runs, Ray Serve's
``@serve.batch`` vs ``CallGatherer``.

In process, no Ray cluster: the real MiniLM embedder (the cpu-local settings: 1 thread, 16 texts
per pass) behind each batcher, and ``--clients`` closed-loop callers that each embed one 4-word
query, then spend a random 0..``--gap-ms`` elsewhere (the rest of a search: shards, fusion, HTTP),
so calls arrive one by one, as they do at the embedder replica. Both batchers run with the
cpu-local settings (up to 32 calls per batch, no wait when idle); ``@serve.batch`` with Serve's
default ``max_concurrent_batches=1``. Modes alternate ``--rounds`` times, same seed.

Reports per mode: embed calls/s, mean calls per forward, p50 / p95 call latency (ms), and the
ratio of the gatherer's calls/s to ``@serve.batch``'s measured in the same run.

NOTE: ``@serve.batch`` reads the replica's ``max_ongoing_requests`` through
``ray.serve.get_replica_context()``, which exists only inside a replica; the benchmark supplies that
one value (64) so the decorator runs unchanged in process.

Example::

    nice -n 10 recallserve bench embed-gather --clients 16 --seconds 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
import types
from typing import Any

import numpy as np

from recallserve.deployments.cli._bench_args import (add_out_argument, add_seconds_argument, check_range,
                                                     write_report)

NAME = "embed-gather"
# NOTE: the words of the 4-word queries; their content does not change a forward pass's cost.
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


def measure(clients: int, seconds: float, gap_ms: float, rounds: int, seed: int) -> dict[str, Any]:
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


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench embed-gather``."""
    p = subparsers.add_parser(NAME, help="embed calls/s of Ray Serve's @serve.batch vs CallGatherer, in process")
    p.add_argument("--clients", type=int, default=16, help="concurrent callers, 1-256 (default: 16)")
    add_seconds_argument(p, 8.0, "per mode and round (1-120)")
    p.add_argument("--gap-ms", type=float, default=40.0, help="most ms a caller spends between embed calls, 0-1000 (default: 40)")
    p.add_argument("--rounds", type=int, default=2, help="alternations of the two modes, 1-10 (default: 2)")
    p.add_argument("--seed", type=int, default=7, help="random seed of the callers (default: 7)")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Alternate the modes, print and write the JSON report."""
    check_range("clients", args.clients, 1, 256)
    check_range("seconds", args.seconds, 1, 120)
    check_range("gap-ms", args.gap_ms, 0, 1000)
    check_range("rounds", args.rounds, 1, 10)
    report = measure(args.clients, args.seconds, args.gap_ms, args.rounds, args.seed)
    print(json.dumps(report, indent=2))
    write_report(args, report)
    return 0
