"""Chaos run: ``kill -9`` a random shard, ingress or state replica under mixed load, N times.

Usage::

    python -m loadtests.chaos_run                     # 20 kills, one every 6 s, 4 clients
    python -m loadtests.chaos_run --kills 30 --every 5 --out loadtests/results/chaos-run

What it does (all on 127.0.0.1, scratch folders under ``.recallserve/``, stops by itself):

1. starts the cluster (``recallserve.deployments.runner``) with the profile (default ``cpu-local``, chat roles
   on the tiny ``--model``);
2. runs ``--clients`` closed-loop clients: the first half make session chat turns
   (``metadata.session_id``, ``agent: off``, ``max_tokens`` 8, the turn recorded on
   acknowledgement), the others memory writes (the id recorded on acknowledgement), reads by id
   and searches;
3. every ``--every`` seconds picks a replica of a memory shard, the ingress or the state
   deployment (PIDs of the processes Ray titles ``ray::ServeReplica:<app>:<deployment>``, only
   among this script's own descendants) and sends it SIGKILL; then probes that deployment's path
   until it answers 200 (recovery time);
4. after the last kill and a settle, reads every acknowledged memory id back and every
   session's ``message_count`` (``GET /v1/sessions/{id}?user=``), and reports writes lost,
   turns lost, failed requests per kill and each recovery time (``--out``.md / .json).

Exit code 0 when no acknowledged write or session turn was lost.
NOTE: it starts Ray and loads models: minutes of CPU on a 2-core machine; never run in CI.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import signal
import statistics
import sys
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any, Literal

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from loadtests._guard import check_host  # noqa: E402
from loadtests._report import check_bounds, cluster_run_parser  # noqa: E402
from recallserve.client import AsyncRecallServe, ConnectionFailed, RecallServe, RecallServeError, RetryPolicy  # noqa: E402

__all__ = ["parse_args", "kill_windows", "lost_turns", "message_count", "read_back", "render_markdown", "unread_sessions", "main"]

TARGETS = ("shard", "ingress", "state")
READ_BACK_S = 60.0  # NOTE: how long a read-back retries a refused or failed read before "unanswered"
USER = "chaos"


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Arguments, bounded so one run stays short and loopback-only."""
    p = cluster_run_parser("chaos_run", __doc__, "chaos-run")
    p.add_argument("--kills", type=int, default=20, help="replicas to kill (1-200, default 20)")
    p.add_argument("--every", type=float, default=6.0, help="seconds between kills (1-120, default 6)")
    p.add_argument("--clients", type=int, default=4, help="closed-loop HTTP clients, the first half chatting (2-32, default 4)")
    p.add_argument("--recovery-timeout", type=float, default=120.0, help="seconds a kill may take to recover")
    p.add_argument("--port", type=int, default=8017, help="HTTP port on 127.0.0.1 (not 8000: leave that to `up`)")
    p.add_argument("--seed", type=int, default=14, help="random seed of the kill order")
    return check_bounds(p, p.parse_args(argv), [("kills", 1, 200), ("every", 1, 120), ("clients", 2, 32), ("recovery_timeout", 5, 600),
                         ("port", 1024, 65535)])


def kill_windows(kills: list[dict[str, Any]], records: list[tuple[float, str, int]], end: float) -> list[int]:
    """Failed requests (status != 200) between each kill and the next (the last: until ``end``)."""
    bounds = [k["t"] for k in kills] + [end]
    return [sum(1 for t, _kind, status in records if bounds[i] <= t < bounds[i + 1] and status != 200)
            for i in range(len(kills))]


def lost_turns(acked: dict[str, int], counts: dict[str, int | None]) -> int:
    """Acknowledged turns missing from their sessions (a turn stores a user and an assistant message);
    a session whose count could not be read (None) is not counted here: see :func:`unread_sessions`."""
    return sum(max(0, n - (counts.get(sid) or 0) // 2) for sid, n in acked.items() if counts.get(sid, 0) is not None)


def unread_sessions(counts: dict[str, int | None]) -> int:
    """Sessions whose message count the state deployment never answered during the read-back."""
    return sum(1 for c in counts.values() if c is None)


def render_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown page."""
    m, c = report["meta"], report["checks"]
    lines = [f"# Chaos run ({m['started_utc']})", "",
             f"Profile {m['profile']}, chat model {m['model']}; {m['clients']} clients; a `kill -9` every "
             f"{m['every']} s, {len(report['kills'])} kills.", "",
             "| # | target | deployment | pid | failed requests until next kill | recovery |",
             "|---:|---|---|---:|---:|---:|"]
    for i, k in enumerate(report["kills"], 1):
        rec = f"{k['recovery_s']:.2f} s" if k["recovery_s"] is not None else "not recovered"
        lines.append(f"| {i} | {k['target']} | {k['deployment']} | {k['pid']} | {k['failed']} | {rec} |")
    rs = [k["recovery_s"] for k in report["kills"] if k["recovery_s"] is not None]
    lines += ["", f"Requests: {c['requests']} ({c['failed']} failed). Recovery: median "
                  f"{statistics.median(rs) if rs else float('nan'):.2f} s, max {max(rs) if rs else float('nan'):.2f} s.",
              f"Acknowledged writes: {c['acked_writes']}, lost {c['writes_lost']}, never read back "
              f"{c.get('writes_unverified', 0)}. Acknowledged session turns: {c['acked_turns']} in {c['sessions']} "
              f"sessions, lost {c['turns_lost']} (sessions never read back: {c.get('sessions_unread', 0)}). "
              f"**{'PASS' if report['ok'] else 'FAIL'}**", ""]
    if c.get("statuses_by_kind"):
        lines += ["| request | answers by status (-1: no answer) |", "|---|---|"]
        lines += [f"| {kind} | {', '.join(f'{s}: {n}' for s, n in sorted(counts.items()))} |"
                  for kind, counts in sorted(c["statuses_by_kind"].items())] + [""]
    return "\n".join(lines)


class Load:
    """Closed-loop clients; every request recorded as (t, kind, status)."""

    def __init__(self, base: str, key: str, model: str, clients: int) -> None:
        self.base, self.key, self.model, self.clients = base, key, model, clients
        self.records: list[tuple[float, str, int]] = []
        self.seconds: dict[str, list[float]] = {}
        self.samples: list[dict[str, Any]] = []  # the first failures, for the report
        self.acked: list[str] = []
        self.turns: dict[str, int] = {}
        self.stop = threading.Event()

    async def _one(self, rs: AsyncRecallServe, rng: random.Random, client: int, n: int) -> None:
        roll = rng.random()
        # NOTE: the first half of the clients only chat (a turn takes seconds on a CPU model under this
        # load), the others write, read and search.
        kind = ("turn" if client < self.clients // 2 else "write" if roll < 0.5 or not self.acked
                else "read" if roll < 0.75 else "search")
        sid = f"chaos-{client}"
        started = time.time()
        status, body, ids = 200, "", []
        try:
            if kind == "write":
                ids = (await rs.memories.add([{"text": f"chaos note {client}-{n}: valve {n % 13} reads {n % 97} bar"}])).ids
            elif kind == "read":
                await rs.memories.get(rng.choice(self.acked))
            elif kind == "search":
                await rs.memories.search(f"valve {n % 13}", k=3)
            else:
                await rs.chat([{"role": "user", "content": f"Note {n}: say OK."}], model=self.model, user=USER,
                              max_tokens=8, metadata={"session_id": sid, "agent": "off"})
        except ConnectionFailed as exc:  # NOTE: no answer is a failed request here (status -1)
            status, body = -1, str(exc)[:300]
        except RecallServeError as exc:
            status, body = exc.status, exc.message[:300]
        self.records.append((time.time(), kind, status))
        self.seconds.setdefault(kind, []).append(time.time() - started)
        if status != 200 and len(self.samples) < 30:
            self.samples.append({"t": time.time(), "kind": kind, "status": status, "body": body})
        if status == 200 and kind == "write":
            self.acked.extend(ids)
        elif status == 200 and kind == "turn":
            self.turns[sid] = self.turns.get(sid, 0) + 1

    async def run(self) -> None:
        async def client(i: int) -> None:
            rng, n = random.Random(i), 0
            # NOTE: retries off: each failed answer during a kill is what the report counts.
            async with AsyncRecallServe(self.base, self.key, timeout=60.0, retry=RetryPolicy(max_retries=0)) as rs:
                while not self.stop.is_set():
                    n += 1
                    await self._one(rs, rng, i, n)

        await asyncio.gather(*(client(i) for i in range(self.clients)))


def _replicas(app: str) -> list[tuple[str, str, int]]:
    """(target, deployment, pid) of every live replica of ``app`` among this process's descendants.

    Ray titles an actor's worker process ``ray::ServeReplica:<app>:<deployment>`` (with a
    ``.<method>`` suffix while it runs one); only processes this script started (the embedded Ray
    is its child) are looked at, and Ray's state API is not needed (no dashboard here).
    """
    import psutil

    out = []
    for proc in psutil.Process(os.getpid()).children(recursive=True):
        try:
            title = " ".join(proc.cmdline())
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
        if not title.startswith("ray::ServeReplica:"):
            continue
        parts = title.split()[0].removeprefix("ray::").split(":")
        if len(parts) != 3 or parts[1] != app:
            continue
        dep = parts[2].split(".")[0]
        target = "shard" if dep.startswith("memory_shard") else dep if dep in ("ingress", "state") else None
        if target:
            out.append((target, dep, proc.pid))
    return out


def _probe(rs: RecallServe, target: str) -> bool:
    """One request that needs ``target``: a memory search (shard), health (ingress), a session (state)."""
    try:
        if target == "shard":
            rs.memories.search("valve", k=3)
        elif target == "state":
            rs.sessions.get("chaos-0", user=USER)
        else:
            rs.health()
    except RecallServeError as exc:
        # NOTE: a session the state replica answers "not found" for is a recovered state replica.
        return target == "state" and exc.status == 404
    return True


ReadBack = Literal["stored", "missing", "unanswered"]


def read_back(get: Callable[[str], Any], item_id: str, within_s: float = READ_BACK_S) -> ReadBack:
    """Whether an acknowledged item is there: ``get(item_id)`` (``rs.memories.get``, ``rs.experiences.get``).

    ``"stored"`` on a 200, ``"missing"`` on a 404 (a lost write), ``"unanswered"`` when no answer but
    a refusal or an error came within ``within_s`` (tried every 0.5 s). A replica still reopening after a
    kill answers 503 for a while; counting that as a lost write would report a loss nothing proved.
    """
    deadline = time.monotonic() + within_s
    while True:
        try:
            get(item_id)
            return "stored"
        except RecallServeError as exc:
            if exc.status == 404:
                return "missing"
        if time.monotonic() >= deadline:
            return "unanswered"
        time.sleep(0.5)


def message_count(rs: RecallServe, session_id: str, user: str = USER, within_s: float = READ_BACK_S) -> int | None:
    """The session's ``message_count`` as the state deployment answers it: 0 for a session it does not
    know (404), None when it gave no answer within ``within_s`` (tried every 0.5 s)."""
    deadline = time.monotonic() + within_s
    while True:
        try:
            return rs.sessions.get(session_id, user=user).message_count
        except RecallServeError as exc:
            if exc.status == 404:
                return 0
        if time.monotonic() >= deadline:
            return None
        time.sleep(0.5)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from loadtests._cluster import scratch_config

    scratch = ROOT / ".recallserve" / time.strftime("chaos-%Y%m%dT%H%M%S", time.gmtime())
    config = scratch_config(args.profile, args.port, scratch, args.model)
    base = check_host(f"http://127.0.0.1:{args.port}")
    key = next(iter(config.auth.keys), None)
    if key is None:
        raise SystemExit("chaos_run: the profile has no auth.keys entry to call the API with")

    from recallserve.deployments import runner

    rng = random.Random(args.seed)
    load = Load(base, key, config.chat.model_name, args.clients)
    kills: list[dict[str, Any]] = []
    runner.prepare_models(config, progress=False)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    try:
        runner.start_ray(config)
        runner.deploy(config)
        thread = threading.Thread(target=lambda: asyncio.run(load.run()), daemon=True)
        thread.start()
        print(f"chaos_run: cluster up; {args.clients} clients; {args.kills} kills every {args.every} s", flush=True)
        with RecallServe(base, key, timeout=10.0, retry=RetryPolicy(max_retries=0)) as rs:
            for i in range(args.kills):
                time.sleep(args.every)
                target = rng.choice(TARGETS)
                choices = [r for r in _replicas(config.name) if r[0] == target]
                if not choices:
                    raise SystemExit(f"chaos_run: no live {target} replica found in app {config.name!r}")
                _, dep, pid = rng.choice(choices)
                t0 = time.time()
                os.kill(pid, signal.SIGKILL)
                recovery = None
                while time.time() - t0 < args.recovery_timeout:
                    if _probe(rs, target):
                        recovery = time.time() - t0
                        break
                    time.sleep(0.2)
                kills.append({"t": t0, "target": target, "deployment": dep, "pid": pid, "recovery_s": recovery})
                print(f"chaos_run: kill {i + 1}/{args.kills}: {dep} pid {pid}, recovered in "
                      f"{recovery if recovery is None else round(recovery, 2)} s", flush=True)
            time.sleep(args.every)
            load.stop.set()
            thread.join(timeout=120)
            end = time.time()
            acked = list(load.acked)
            verdicts = [read_back(rs.memories.get, rid) for rid in acked]
            lost, unverified = verdicts.count("missing"), verdicts.count("unanswered")
            counts = {sid: message_count(rs, sid) for sid in load.turns}
    finally:
        load.stop.set()
        runner.shutdown()
    for k, failed in zip(kills, kill_windows(kills, load.records, end)):
        k["failed"] = failed
    by_kind: dict[str, dict[str, int]] = {}
    for _t, kind, status in load.records:
        by_kind.setdefault(kind, {}).setdefault(str(status), 0)
        by_kind[kind][str(status)] += 1
    checks = {"requests": len(load.records), "failed": sum(1 for r in load.records if r[2] != 200),
              "statuses_by_kind": by_kind,
              "p50_s_by_kind": {k: round(statistics.median(v), 3) for k, v in load.seconds.items()},
              "failure_samples": load.samples,
              "acked_writes": len(acked), "writes_lost": lost, "writes_unverified": unverified,
              "acked_turns": sum(load.turns.values()), "sessions": len(load.turns),
              "turns_lost": lost_turns(load.turns, counts), "sessions_unread": unread_sessions(counts), "message_counts": counts}
    report = {"meta": {"started_utc": started, "profile": args.profile, "model": args.model, "clients": args.clients,
                       "every": args.every, "seed": args.seed},
              "kills": kills, "checks": checks, "ok": lost == unverified == checks["turns_lost"] == checks["sessions_unread"] == 0}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(report))
    print(render_markdown(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
