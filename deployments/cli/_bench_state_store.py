"""``recallserve bench state-store``: what the state deployment costs a chat turn, session-store calls through a
Ray handle vs in process.

A chat turn with a ``session_id`` makes three session-store calls (open, snapshot, append). Since
sessions moved into the one-replica ``state`` deployment, each is a handle call instead of a local
SQLite call. This starts a scratch Ray on this machine (nothing listens on a network port),
deploys only the ``state`` deployment with the cpu-local options, and times the same three calls
per turn both ways in the same run: sequential turns (latency), then ``--clients``
concurrent sessions (throughput). Prints a table and writes it beside the JSON figures.

    recallserve bench state-store --turns 200 --clients 8
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from recallserve.deployments.cli._bench_args import add_out_argument, check_range, write_report
from recallserve.serve.context._types import Message

NAME = "state-store"


async def _turn(store: Any, session_id: str, n: int) -> float:
    """One chat turn's store calls; returns its seconds."""
    start = time.perf_counter()
    session = await store.open("bench", "u1", session_id)
    await store.append(session, [Message(role="user", content=f"question {n} about order 104208"),
                                 Message(role="assistant", content=f"answer {n}")], [[], []])
    await store.snapshot("bench", "u1", session_id)  # what ContextManager.assemble reads
    return time.perf_counter() - start


async def _measure(store: Any, turns: int, clients: int, tag: str) -> dict[str, float]:
    seq = [await _turn(store, f"{tag}-seq-{i // 20}", i) for i in range(turns)]  # 20 turns per session

    async def client(c: int) -> None:
        for i in range(turns // clients):
            await _turn(store, f"{tag}-c{c}-{i // 20}", i)

    start = time.perf_counter()
    await asyncio.gather(*(client(c) for c in range(clients)))
    wall = time.perf_counter() - start
    q = statistics.quantiles(seq, n=20)
    return {"p50_ms": 1e3 * statistics.median(seq), "p95_ms": 1e3 * q[18],
            "turns_per_s": (turns // clients) * clients / wall}


def _run(turns: int, clients: int) -> dict[str, Any]:
    import ray
    from ray import serve

    from recallserve.deployments import runner
    from recallserve.deployments.config import load_config
    from recallserve.deployments.state import RemoteStore, StateStore
    from recallserve.serve.context import SessionStore

    scratch = Path(tempfile.mkdtemp(prefix="rs-state-bench-"))
    config = load_config("cpu-local", overrides={"ray": {"temp_dir": str(scratch / "ray"), "num_cpus": 2}})
    opts = config.state_store.to_ray_options()
    runner.start_ray(config)  # no auth token in $HOME, no usage stats, a socket-safe temp folder
    try:
        dep = serve.deployment(StateStore, name="state").options(**opts)
        handle = serve.run(dep.bind(str(scratch / "remote")), name="state-bench", route_prefix=None)
        local = SessionStore(scratch / "local" / "sessions.sqlite3")

        def measure(store: Any, tag: str) -> Callable[[], Awaitable[dict[str, float]]]:
            return lambda: _measure(store, turns, clients, tag)

        asyncio.run(_measure(local, 20, 2, "warm"))  # first connections, first pages
        results = {"in process": asyncio.run(measure(local, "local")()),
                   "state deployment": asyncio.run(measure(RemoteStore(handle, "sessions"), "remote")())}
        local.close()
    finally:
        serve.shutdown()
        ray.shutdown()
    return results


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench state-store``."""
    p = subparsers.add_parser(NAME, help="session-store calls through the state deployment vs in process (starts Ray)")
    p.add_argument("--turns", type=int, default=200, help="turns per measurement, >= 20 (default: 200)")
    p.add_argument("--clients", type=int, default=8, help="concurrent sessions in the throughput run, >= 1 (default: 8)")
    add_out_argument(p, NAME, markdown=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start a scratch Ray with the state deployment, time both stores, print and write the table."""
    check_range("turns", args.turns, 20, 1_000_000)
    check_range("clients", args.clients, 1, 1024)
    results = _run(args.turns, args.clients)
    base, remote = results["in process"], results["state deployment"]
    lines = [f"# Session store: in process vs the state deployment ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})",
             "", f"3 store calls per chat turn (open, append, snapshot); {args.turns} sequential turns, then {args.clients} concurrent sessions.", "",
             "| store | turn p50 | turn p95 | turns/s (concurrent) |", "|---|---:|---:|---:|"]
    for name, r in results.items():
        lines.append(f"| {name} | {r['p50_ms']:.1f} ms | {r['p95_ms']:.1f} ms | {r['turns_per_s']:.0f} |")
    lines += ["", f"Overhead per turn (p50): {remote['p50_ms'] - base['p50_ms']:.1f} ms "
                  f"({remote['p50_ms'] / base['p50_ms']:.1f}x in-process); throughput ratio "
                  f"{remote['turns_per_s'] / base['turns_per_s']:.2f}."]
    table = "\n".join(lines) + "\n"
    print(table)
    write_report(args, {"turns": args.turns, "clients": args.clients, **results}, table)
    return 0
