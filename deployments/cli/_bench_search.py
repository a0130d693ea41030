"""``recallserve bench search``: memory search latency and throughput through the running cluster.

Writes ``--memories`` memories for one tenant through ``POST /v1/memories`` (batches of 50; skipped
when the tenant already holds that many from an earlier run with the same ``--tag``), then for each
``--clients`` level runs that many closed-loop clients sending ``POST /v1/memories/search`` for
``--seconds`` and reports answers/s, p50 / p95 / p99 latency and the status counts (a 503 with
``Retry-After`` is the memory tier refusing load, not an error of the benchmark).

Everything goes through the Ray Serve proxy, so the figures include what a client pays: HTTP,
the ingress, the embedder deployment (query embedding), the shards and the fusion.

Example::

    recallserve up &
    recallserve bench search --memories 2000 --clients 1,4,16,64 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import random
import statistics
import time
from pathlib import Path
from typing import Any

from deployments.cli import UserError
from deployments.cli._cluster_client import add_cluster_arguments, cluster_base, write_json

NAME = "search"
_WORDS = ("printer jam tray roller toner drum fuser paper error code cartridge scanner wifi driver firmware "
          "invoice refund order delivery courier parcel return label warranty repair boiler valve pump pressure "
          "display ribbon cable thermal fuse grinder burr espresso milk frother descale filter").split()


def _text(rng: random.Random, i: int) -> str:
    words = " ".join(rng.choice(_WORDS) for _ in range(rng.randint(12, 40)))
    return f"Ticket T-{10_000 + i}: {words}."


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _seed(http: Any, n: int, tag: str, rng: random.Random) -> float:
    """Write ``n`` memories tagged ``tag`` unless they are there; seconds spent writing."""
    have = await http.get("/v1/memories", params={"source_id": f"bench-search-{tag}-{n - 1}"})
    if have.status_code == 200 and have.json().get("data"):
        return 0.0
    start = time.perf_counter()
    for lo in range(0, n, 50):
        batch = [{"text": _text(rng, i), "source_id": f"bench-search-{tag}-{i}", "topic": "bench/search"}
                 for i in range(lo, min(n, lo + 50))]
        r = await http.post("/v1/memories", json={"memories": batch})
        if r.status_code != 200:
            raise UserError(f"seeding: POST /v1/memories answered {r.status_code}: {r.text[:200]}")
    return time.perf_counter() - start


async def _level(http: Any, clients: int, seconds: float, rng: random.Random) -> dict[str, Any]:
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    stop = time.perf_counter() + seconds

    async def client() -> None:
        while time.perf_counter() < stop:
            query = " ".join(rng.choice(_WORDS) for _ in range(4))
            t0 = time.perf_counter()
            try:
                r = await http.post("/v1/memories/search", json={"query": query, "k": 10})
                status = str(r.status_code)
            except Exception as exc:  # noqa: BLE001 - a transport failure is counted, not raised
                status = type(exc).__name__
            if status == "200":
                latencies.append(time.perf_counter() - t0)
            statuses[status] = statuses.get(status, 0) + 1

    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - start
    ms = [1e3 * x for x in latencies]
    return {"clients": clients, "answers_per_s": len(ms) / wall, "p50_ms": _quantile(ms, 0.5),
            "p95_ms": _quantile(ms, 0.95), "p99_ms": _quantile(ms, 0.99), "statuses": statuses,
            "mean_ms": statistics.fmean(ms) if ms else None}


async def _main(args: argparse.Namespace, base: str) -> dict[str, Any]:
    import httpx

    rng = random.Random(args.seed)
    limits = httpx.Limits(max_connections=max(args.clients) + 4)
    async with httpx.AsyncClient(base_url=base, headers={"Authorization": f"Bearer {args.key}"}, timeout=60.0,
                                 limits=limits) as http:
        seeded = await _seed(http, args.memories, args.tag, rng)
        if seeded:
            print(f"seeded {args.memories} memories in {seeded:.1f} s ({args.memories / seeded:.1f}/s)", flush=True)
        await _level(http, 1, 2.0, rng)  # NOTE: warm-up, not reported
        levels = []
        for clients in args.clients:
            row = await _level(http, clients, args.seconds, rng)
            print(f"{clients:>3} clients: {row['answers_per_s']:.1f} answers/s, p50 {row['p50_ms'] or 0:.0f} ms, "
                  f"p95 {row['p95_ms'] or 0:.0f} ms, statuses {row['statuses']}", flush=True)
            levels.append(row)
    return {"url": base, "memories": args.memories, "seconds": args.seconds, "seeding_s": seeded, "levels": levels}


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench search``."""
    p = subparsers.add_parser(NAME, help="memory search latency and throughput through the running cluster")
    add_cluster_arguments(p)
    p.add_argument("--memories", type=int, default=2000, help="memories in the tenant (50-1000000, default 2000)")
    p.add_argument("--clients", default="1,4,16,64", help="comma-separated concurrency levels (default 1,4,16,64)")
    p.add_argument("--seconds", type=float, default=10.0, help="seconds per level (1-600, default 10)")
    p.add_argument("--tag", default="v1", help="names the seeded set, so a rerun reuses it (default v1)")
    p.add_argument("--seed", type=int, default=0, help="random seed of texts and queries")
    p.add_argument("--out", type=Path, default=None, help="JSON output (default: bench-results/search-<time>.json)")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Seed, time each level, print, write JSON."""
    try:
        args.clients = [int(c) for c in args.clients.split(",") if c.strip()]
    except ValueError:
        raise UserError(f"--clients: expected numbers like 1,4,16, got {args.clients!r}") from None
    if not args.clients or not all(1 <= c <= 256 for c in args.clients):
        raise UserError("--clients: each level must be within [1, 256]")
    if not 50 <= args.memories <= 1_000_000 or not 1 <= args.seconds <= 600:
        raise UserError("--memories must be within [50, 1000000] and --seconds within [1, 600]")
    report = asyncio.run(_main(args, cluster_base(args.url)))
    write_json(args.out, "search", report)
    return 0
