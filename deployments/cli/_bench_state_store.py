"""``recallserve bench state-store``: what the state stores cost a chat turn, by backend, in the same run.

A chat turn with a ``session_id`` makes three session-store calls (open, append, snapshot). This
times them at 1, 8 and 32 concurrent sessions (``--sessions``) on each way the cluster can keep
state, one after the other in the same run on the same machine:

- ``sqlite in process``: the embedded store, no Ray (the floor);
- ``state deployment``: the ``sqlite`` default of a cluster, every call a handle call to the one
  ``state`` replica (a scratch Ray on this machine, no network port);
- ``postgres, 1 replica``: one ingress replica's pool (``--state-dsn``);
- ``postgres, 2 replicas``: two processes, each with its own pool, the sessions split between
  them (what two ingress replicas do: no replica in between).

Each row gives turns per second (all turns / wall time of the concurrent run) and the p50/p95 of
the single store calls. Prints a table and writes it beside the JSON figures.

    recallserve bench state-store --turns 20 --sessions 1,8,32 --state-dsn postgresql://...
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import add_out_argument, check_range, write_report
from recallserve.serve.context._types import Message

NAME = "state-store"


async def _turn(store: Any, session_id: str, n: int, calls: list[float]) -> None:
    """One chat turn's store calls; appends each call's seconds to ``calls``."""
    t0 = time.perf_counter()
    session = await store.open("bench", "u1", session_id)
    t1 = time.perf_counter()
    await store.append(session, [Message(role="user", content=f"question {n} about order 104208"),
                                 Message(role="assistant", content=f"answer {n}")], [[], []])
    t2 = time.perf_counter()
    await store.snapshot("bench", "u1", session_id)  # what ContextManager.assemble reads
    calls += [t1 - t0, t2 - t1, time.perf_counter() - t2]


async def _sessions(store: Any, tag: str, ids: range, turns: int) -> tuple[list[float], float]:
    """``turns`` turns in each session of ``ids``, the sessions concurrent; (call seconds, wall seconds)."""
    calls: list[float] = []

    async def one(c: int) -> None:
        for i in range(turns):
            await _turn(store, f"{tag}-s{c}", i, calls)

    start = time.perf_counter()
    await asyncio.gather(*(one(c) for c in ids))
    return calls, time.perf_counter() - start


def _figures(calls: list[float], wall: float, turns: int) -> dict[str, float]:
    q = statistics.quantiles(calls, n=20) if len(calls) > 1 else calls * 19
    return {"turns_per_s": turns / wall, "call_p50_ms": 1e3 * statistics.median(calls), "call_p95_ms": 1e3 * q[18]}


def _pg_worker(dsn: str, tag: str, ids: range, turns: int, pool: int, start_at: float,
               out: Any) -> None:
    """A second ingress replica: its own process and pool; waits for ``start_at`` then runs its sessions."""
    from recallserve.serve.context import SessionStore
    from recallserve.serve.statedb import PostgresDatabase

    db = PostgresDatabase(dsn, pool_size=pool)
    store = SessionStore(db=db)
    time.sleep(max(0.0, start_at - time.time()))
    calls, wall = asyncio.run(_sessions(store, tag, ids, turns))
    db.close()
    out.put((calls, wall))


def _two_replicas(dsn: str, tag: str, n: int, turns: int, pool: int) -> dict[str, float]:
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    start_at = time.time() + 3.0  # NOTE: both processes imported and connected before the clock starts
    halves = [range(0, (n + 1) // 2), range((n + 1) // 2, n)]
    procs = [ctx.Process(target=_pg_worker, args=(dsn, f"{tag}-r{i}", ids, turns, pool, start_at, out))
             for i, ids in enumerate(halves) if len(ids)]
    for p in procs:
        p.start()
    results = [out.get(timeout=600) for _ in procs]
    for p in procs:
        p.join(30)
    calls = [c for r in results for c in r[0]]
    return _figures(calls, max(r[1] for r in results), n * turns)


def _run(turns: int, levels: list[int], dsn: str | None, pool: int) -> dict[str, dict[str, dict[str, float]]]:
    import ray
    from ray import serve

    from recallserve.deployments import runner
    from recallserve.deployments.config import load_config
    from recallserve.deployments.state import RemoteStore, StateStore
    from recallserve.serve.context import SessionStore
    from recallserve.serve.statedb import PostgresDatabase

    scratch = Path(tempfile.mkdtemp(prefix="rs-state-bench-"))
    config = load_config("cpu-local", overrides={"ray": {"temp_dir": str(scratch / "ray"), "num_cpus": 2}})
    opts = config.state_store.to_ray_options()
    runner.start_ray(config)  # no auth token in $HOME, no usage stats, a socket-safe temp folder
    results: dict[str, dict[str, dict[str, float]]] = {}
    run_id = time.strftime("%H%M%S")
    try:
        dep = serve.deployment(StateStore, name="state").options(**opts)
        handle = serve.run(dep.bind(str(scratch / "remote")), name="state-bench", route_prefix=None)
        stores: dict[str, Any] = {"sqlite in process": SessionStore(scratch / "local" / "sessions.sqlite3"),
                                  "state deployment": RemoteStore(handle, "sessions")}
        db = None
        if dsn:
            db = PostgresDatabase(dsn, pool_size=pool)
            stores["postgres, 1 replica"] = SessionStore(db=db)
        for name, store in stores.items():
            asyncio.run(_sessions(store, f"warm-{run_id}-{name[:6]}", range(2), 5))  # connections, first pages
        for n in levels:
            row: dict[str, dict[str, float]] = {}
            for name, store in stores.items():
                calls, wall = asyncio.run(_sessions(store, f"{run_id}-{name[:6]}-{n}", range(n), turns))
                row[name] = _figures(calls, wall, n * turns)
            if dsn:
                row["postgres, 2 replicas"] = _two_replicas(dsn, f"{run_id}-pg2-{n}", n, turns, pool)
            results[str(n)] = row
        stores["sqlite in process"].close()
        if db is not None:
            db.close()
    finally:
        serve.shutdown()
        ray.shutdown()
    return results


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench state-store``."""
    p = subparsers.add_parser(NAME, help="session-store calls per backend at 1/8/32 sessions (starts Ray)")
    p.add_argument("--turns", type=int, default=20, help="turns per session, >= 2 (default: 20)")
    p.add_argument("--sessions", default="1,8,32", help="concurrent sessions, comma-separated (default: 1,8,32)")
    p.add_argument("--state-dsn", default=None, help="PostgreSQL DSN for the postgres rows (left out without it)")
    p.add_argument("--pool", type=int, default=8, help="connections per replica's pool, 1-64 (default: 8)")
    add_out_argument(p, NAME, markdown=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Start a scratch Ray with the state deployment, time every backend, print and write the table."""
    check_range("turns", args.turns, 2, 100_000)
    check_range("pool", args.pool, 1, 64)
    try:
        levels = [int(x) for x in str(args.sessions).split(",") if x.strip()]
    except ValueError:
        raise UserError(f"--sessions: expected comma-separated integers, got {args.sessions!r}") from None
    for n in levels:
        check_range("sessions", n, 1, 1024)
    results = _run(args.turns, levels, args.state_dsn, args.pool)
    lines = [f"# State stores by backend ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})", "",
             f"3 session-store calls per chat turn (open, append, snapshot); {args.turns} turns per session; "
             f"pool {args.pool} per replica.", "",
             "| sessions | backend | turns/s | call p50 | call p95 |", "|---:|---|---:|---:|---:|"]
    for n, row in results.items():
        for name, r in row.items():
            lines.append(f"| {n} | {name} | {r['turns_per_s']:.0f} | {r['call_p50_ms']:.1f} ms | "
                         f"{r['call_p95_ms']:.1f} ms |")
    for n, row in results.items():
        if "postgres, 1 replica" in row:
            base, pg = row["state deployment"], row["postgres, 1 replica"]
            lines.append(f"\n{n} sessions: postgres p95 / state-deployment p95 = "
                         f"{pg['call_p95_ms'] / base['call_p95_ms']:.2f}; 2 replicas / 1 replica turns/s = "
                         f"{row['postgres, 2 replicas']['turns_per_s'] / pg['turns_per_s']:.2f}")
    table = "\n".join(lines) + "\n"
    print(table)
    write_report(args, {"turns": args.turns, "sessions": levels, "pool": args.pool, "results": results}, table)
    return 0
