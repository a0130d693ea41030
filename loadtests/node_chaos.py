"""Node-loss chaos: SIGKILL a whole worker node (its raylet and every process on it) N times under 2 tenants' load.

Usage::

    python -m loadtests.node_chaos                          # 10 kills, one every 20 s, head + 2 workers
    python -m loadtests.node_chaos --kills 2 --every 15 --out /tmp/node-chaos

What it does (all on 127.0.0.1, scratch folders under ``.recallserve/``, stops by itself):

1. starts the profile (default ``cpu-local``, the chat roles on the tiny ``--model``) on
   ``ray.nodes`` = 3 raylets (``recallserve.deployments.local_nodes``): memory shards one per worker,
   2 ingress replicas, models, embedder and state on the head;
2. two tenants whose private memories live on different shards (``records.tenant_key`` mod shards),
   each with a chat client (session turns, ``agent: off``, ``max_tokens`` 8; a turn counts once
   answered 200) and a memory client (writes, reads by id, searches, and every 4th request an
   experience write; an id counts once answered 200/201);
3. every ``--every`` seconds kills the worker node that holds a shard (alternating which tenant's home
   shard), starts a replacement node at once (the same custom resources: the lost shard is placed on
   it and reopens its folder), and probes the lost shard's tenant with a search until it answers 200
   (the recovery time);
4. at the end reads back every acknowledged memory, experience and session turn.

Reported (``--out``.md / .json): lost acknowledged writes / turns / experiences, failed requests by
kind (fast 503 with Retry-After, proxy 500, timeout, other), recovery p50 and max, and the other
tenant's success rate inside each outage (from the kill to the recovery). Exit 0 when nothing
acknowledged was lost. NOTE: starts 3 raylets and a model: minutes of CPU on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import statistics
import sys
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from loadtests._guard import check_host  # noqa: E402
from loadtests._report import check_bounds, cluster_run_parser  # noqa: E402
from recallserve.client import AsyncRecallServe, RecallServe, RecallServeError, RetryPolicy  # noqa: E402

__all__ = ["parse_args", "classify", "pick_tenants", "home_shard", "outage_success", "RedisServer", "Load", "start_load",
           "tenant_keys_env", "kill_nodes", "gcs_outage", "outage_requests", "verify", "summarise", "render_markdown", "main"]

USER = "node-chaos"
KEYS = ("sk-node-a", "sk-node-b")
#: Retries off: a failed answer is what the run counts, and a probe repeats by itself.
NO_RETRY = RetryPolicy(max_retries=0)


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """Arguments, bounded so one run stays short and loopback-only."""
    p = cluster_run_parser("node_chaos", __doc__, "node-chaos")
    p.add_argument("--nodes", type=int, default=3, help="raylets: a head and nodes-1 workers (3-6, default 3)")
    p.add_argument("--kills", type=int, default=10, help="worker nodes to kill (1-200, default 10)")
    p.add_argument("--every", type=float, default=20.0, help="seconds between kills (5-300, default 20)")
    p.add_argument("--recovery-timeout", type=float, default=120.0, help="seconds a lost shard may take to answer")
    p.add_argument("--port", type=int, default=8019, help="HTTP port on 127.0.0.1 (not 8000: leave that to `up`)")
    p.add_argument("--seed", type=int, default=37, help="random seed of the load")
    p.add_argument("--gcs-outage", type=float, default=0.0,
                   help="after the kills, kill the head's GCS for this many seconds and start it again (GCS fault "
                        "tolerance: the run starts its own redis-server on 127.0.0.1); 0 = no outage (0-300)")
    p.add_argument("--state-dsn", default=None, metavar="DSN",
                   help="keep sessions, experiences and traces in this PostgreSQL (as `recallserve up --state-dsn`); "
                        "default: the profile's embedded state")
    return check_bounds(p, p.parse_args(argv), [("nodes", 3, 6), ("kills", 1, 200), ("every", 5, 300), ("recovery_timeout", 5, 600),
                         ("port", 1024, 65535), ("gcs_outage", 0, 300)])


def pick_tenants(num_shards: int) -> tuple[str, str]:
    """Two tenant names whose private memories live on different shards (shard = tenant_key mod num_shards)."""
    from recallserve.memory_shards.records import tenant_key

    first = "tenant-a"
    home = (tenant_key(first) % 2**64) % num_shards
    for i in range(1000):
        other = f"tenant-b{i}"
        if (tenant_key(other) % 2**64) % num_shards != home:
            return first, other
    raise RuntimeError("no second tenant on another shard")  # pragma: no cover - 1000 tries at p = 1/num_shards


def home_shard(tenant: str, num_shards: int) -> int:
    """The shard index that holds ``tenant``'s private memories."""
    from recallserve.memory_shards.records import tenant_key

    return (tenant_key(tenant) % 2**64) % num_shards


def classify(status: int, retry_after: bool) -> str:
    """A failed answer's kind: ``fast_503`` (with Retry-After), ``proxy_500``, ``timeout`` (no answer), ``other_<code>``."""
    if status == 503 and retry_after:
        return "fast_503"
    if status == 500:
        return "proxy_500"
    if status == -1:
        return "timeout"
    return f"other_{status}"


def outage_success(records: list[dict[str, Any]], tenant: str, start: float, end: float) -> tuple[int, int]:
    """(answered ok, requests) of ``tenant`` that started inside [start, end]."""
    inside = [r for r in records if r["tenant"] == tenant and start <= r["t0"] <= end]
    return sum(1 for r in inside if r["ok"]), len(inside)


class RedisServer:
    """Debian's ``redis-server`` on 127.0.0.1 and a free port, in ``folder``, no persistence (the run's GCS tables)."""

    def __init__(self, folder: Path) -> None:
        import socket

        self.folder = folder
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.address = f"127.0.0.1:{self.port}"
        self.proc: Any = None

    def start(self) -> None:
        """Start it and wait until it answers PING (10 s)."""
        import shutil
        import socket
        import subprocess

        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server not found: install Debian's redis-server (scripts/system_deps.sh)")
        self.folder.mkdir(parents=True, exist_ok=True)
        self.proc = subprocess.Popen([binary, "--bind", "127.0.0.1", "--port", str(self.port), "--dir", str(self.folder),
                                      "--save", "", "--appendonly", "no", "--protected-mode", "yes"],
                                     stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1) as sock:
                    sock.sendall(b"PING\r\n")
                    if sock.recv(16).startswith(b"+PONG"):
                        return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError(f"redis-server on {self.address} did not answer PING within 10 s")

    def stop(self) -> None:
        """Terminate it (this process started it) and wait."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)


class Load:
    """Per tenant a chat client and a memory client, closed loop; every request recorded."""

    def __init__(self, base: str, model: str, tenants: dict[str, str]) -> None:
        self.base, self.model, self.tenants = base, model, tenants  # tenant -> key
        self.records: list[dict[str, Any]] = []
        self.samples: list[dict[str, Any]] = []
        self.acked_ids: dict[str, list[str]] = {t: [] for t in tenants}
        self.acked_exps: dict[str, list[str]] = {t: [] for t in tenants}
        self.turns: dict[str, int] = {}
        self.stop = threading.Event()

    async def _one(self, rs: AsyncRecallServe, rng: random.Random, tenant: str, role: str, n: int) -> None:
        roll = rng.random()
        kind = "turn" if role == "chat" else ("experience" if n % 4 == 0 else "write" if roll < 0.4 or not self.acked_ids[tenant]
                                              else "read" if roll < 0.7 else "search")
        sid = f"node-chaos-{tenant}"
        t0 = time.time()
        status, body, fail = 200, "", None
        try:
            if kind == "write":
                added = await rs.memories.add([{"text": f"node chaos note {n}: pump {n % 11} pressure {n % 89} bar"}])
                self.acked_ids[tenant].extend(added.ids)
            elif kind == "read":
                await rs.memories.get(rng.choice(self.acked_ids[tenant]))
            elif kind == "search":
                await rs.memories.search(f"pump {n % 11}", k=3)
            elif kind == "experience":
                view = await rs.experiences.create({
                    "metadata": {"source_model": "node-chaos", "task_domain": "units", "topic": "chaos/speed"},
                    "context": {"raw_text": f"A cart covers {2 * n} m in 2 s."},
                    "reasoning": [{"step_id": 1, "text": "distance over time"}],
                    "outcome": {"answer": f"{n} m/s"}})
                self.acked_exps[tenant].append(view.record.metadata.id)
            else:
                await rs.chat([{"role": "user", "content": f"Note {n}: say OK."}], model=self.model, user=USER,
                              max_tokens=8, metadata={"session_id": sid, "agent": "off"})
                self.turns[sid] = self.turns.get(sid, 0) + 1
        except RecallServeError as exc:  # NOTE: no answer (status 0 in the client) is a timeout here: -1
            status = exc.status or -1
            body = exc.message[:200] if exc.status else exc.reason
            fail = classify(status, exc.retry_after_s is not None)
        self.records.append({"t0": t0, "t1": time.time(), "tenant": tenant, "kind": kind, "status": status,
                             "ok": fail is None, "fail": fail})
        if fail is not None and len(self.samples) < 40:
            self.samples.append({"t": t0, "tenant": tenant, "kind": kind, "status": status, "body": body})

    async def run(self) -> None:
        async def client(tenant: str, role: str, seed: int) -> None:
            rng, n = random.Random(seed), 0
            # NOTE: retries off: each failed answer during an outage is what the report counts.
            async with AsyncRecallServe(self.base, self.tenants[tenant], timeout=60.0, retry=NO_RETRY) as rs:
                while not self.stop.is_set():
                    n += 1
                    await self._one(rs, rng, tenant, role, n)
                    await asyncio.sleep(0.05)  # NOTE: a paced client, so 2 cores serve 4 of them and the kills

        await asyncio.gather(*(client(t, role, i) for i, (t, role) in
                               enumerate((t, role) for t in self.tenants for role in ("chat", "memory"))))


def _shard_nodes(app: str) -> dict[int, str]:
    """Shard index -> node id of its alive replica."""
    from recallserve.deployments.cluster_status import cluster_status

    out = {}
    for r in cluster_status()["replicas"]:
        if r["app"] == app and r["deployment"].startswith("memory_shard_") and r["state"] == "ALIVE" and r["node_id"]:
            out[int(r["deployment"].rsplit("_", 1)[1])] = r["node_id"]
    return out


def render_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown page."""
    m, c = report["meta"], report["checks"]
    lines = [f"# Node-loss chaos ({m['started_utc']})", "",
             f"Profile {m['profile']} on {m['nodes']} raylets on this host (head + {m['nodes'] - 1} workers), chat model "
             f"{m['model']}; tenants {m['tenants'][0]} (home shard {m['homes'][0]}) and {m['tenants'][1]} (home shard "
             f"{m['homes'][1]}), each a chat client and a memory client; a whole worker node SIGKILLed every {m['every']} s "
             f"and a replacement started at once, {len(report['kills'])} kills.", "",
             f"Command: `{m['command']}`", "",
             "| # | lost shard(s) | processes killed | shard answers again | other tenant ok / requests in the outage |",
             "|---:|---|---:|---:|---:|"]
    for i, k in enumerate(report["kills"], 1):
        rec = f"{k['recovery_s']:.1f} s" if k["recovery_s"] is not None else "not recovered"
        lines.append(f"| {i} | {', '.join(map(str, k['shards']))} | {len(k['pids'])} | {rec} | "
                     f"{k['other_ok']} / {k['other_requests']} |")
    st = report.get("status_at_start") or {"nodes": [], "replicas": []}
    placed = {}
    for r in st["replicas"]:
        placed.setdefault(r["deployment"], []).append(r["node_id"][:8] if r["node_id"] else "-")
    roles = {n["node_id"][:8]: n["role"] for n in st["nodes"]}
    where = {d: ", ".join(f"{nid} ({roles.get(nid, '?')})" for nid in ns) for d, ns in sorted(placed.items())}
    lines += ["", "Placement at start (`recallserve status`): " + "; ".join(f"{d} on {w}" for d, w in where.items())]
    lines += ["", "| figure | value | target |", "|---|---:|---|",
              f"| node kills | {len(report['kills'])} | >= 10 |",
              f"| acknowledged memory writes lost (404) / never read back | {c['writes_lost']} / "
              f"{c.get('writes_unverified', 0)} of {c['acked_writes']} | 0 / 0 |",
              f"| acknowledged session turns lost / sessions never read back | {c['turns_lost']} of {c['acked_turns']} / "
              f"{c.get('sessions_unread', 0)} | 0 / 0 |",
              f"| acknowledged experiences lost (404) / never read back | {c['experiences_lost']} / "
              f"{c.get('experiences_unverified', 0)} of {c['acked_experiences']} | 0 / 0 |",
              f"| lost shard answers again, p50 / max | {c['recovery_p50_s']} s / {c['recovery_max_s']} s | max <= 30 s |",
              f"| other tenant's success during outages | {c['other_tenant_success_pct']}% ({c['other_ok']} / "
              f"{c['other_requests']}) | >= 99% |", "",
              f"Requests: {c['requests']}, failed {c['failed']}. **{'PASS' if report['ok'] else 'FAIL'}** "
              "(nothing acknowledged lost)", "",
              "| request | ok | failed by kind |", "|---|---:|---|"]
    for kind, row in sorted(c["by_kind"].items()):
        fails = ", ".join(f"{k}: {v}" for k, v in sorted(row["failed"].items())) or "-"
        lines.append(f"| {kind} | {row['ok']} | {fails} |")
    g = report.get("gcs_outage")
    if g:
        kinds = "; ".join(f"{k} {v['ok']}/{v['requests']}" for k, v in g["by_kind"].items())
        lines += ["", "## GCS outage (GCS fault tolerance, external Redis)", "",
                  f"The head's GCS (pid {g['gcs_pid']}) was killed and started again after {g['down_s']} s. Requests "
                  f"started meanwhile: {g['ok']} of {g['requests']} answered ok "
                  f"({kinds}). "
                  f"After it returned: {g['nodes_alive_after']} nodes alive, {g['replicas_alive_after']} replicas alive."]
    return "\n".join(lines) + "\n"


def start_load(config: Any, port: int) -> tuple[Load, tuple[str, str], list[int], threading.Thread]:
    """Two tenants' clients against the running cluster (keys as set by :func:`tenant_keys_env`)."""
    tenants = pick_tenants(config.memory.num_shards)
    homes = [home_shard(t, config.memory.num_shards) for t in tenants]
    load = Load(check_host(f"http://127.0.0.1:{port}"), config.chat.model_name, dict(zip(tenants, KEYS)))
    thread = threading.Thread(target=lambda: asyncio.run(load.run()), daemon=True)
    thread.start()
    return load, tenants, homes, thread


def tenant_keys_env(num_shards: int) -> str:
    """``RECALLSERVE_API_KEYS`` for the two tenants (the replicas read it from the raylets' environment)."""
    return ",".join(f"{k}:{t}" for k, t in zip(KEYS, pick_tenants(num_shards)))


def kill_nodes(config: Any, nodes: Any, load: Load, tenants: tuple[str, str], homes: list[int], kills: int,
               every: float, recovery_timeout: float) -> list[dict[str, Any]]:
    """``kills`` times: wait ``every`` s, SIGKILL the worker node holding a shard (alternating tenants), start a
    replacement node, probe the lost shard's tenant with searches until one is answered 200."""
    out: list[dict[str, Any]] = []
    probes = {t: RecallServe(load.base, k, timeout=10.0, retry=NO_RETRY) for t, k in zip(tenants, KEYS)}
    try:
        for i in range(kills):
            time.sleep(every)
            shard_nodes = _shard_nodes(config.name)
            wanted = shard_nodes.get(homes[i % 2])
            node = next((w for w in nodes.workers if nodes.node_id(w) == wanted), None)
            if node is None:  # NOTE: that shard is not placed (yet): take any worker holding a shard
                node = next(w for w in nodes.workers if nodes.node_id(w) in shard_nodes.values())
            lost = sorted(s for s, nid in shard_nodes.items() if nid == nodes.node_id(node))
            affected = [t for t, h in zip(tenants, homes) if h in lost]
            other = next((t for t in tenants if t not in affected), None)
            t0 = time.time()
            pids = nodes.kill_worker(node)
            nodes.add_worker()
            recovery = None
            probe_tenant = affected[0] if affected else tenants[i % 2]
            while time.time() - t0 < recovery_timeout:
                try:
                    probes[probe_tenant].memories.search("pump", k=3)
                    recovery = time.time() - t0
                    break
                except RecallServeError:
                    pass
                time.sleep(0.25)
            end = t0 + (recovery if recovery is not None else recovery_timeout)
            ok, n = outage_success(load.records, other, t0, end) if other else (0, 0)
            out.append({"t": t0, "shards": lost, "tenants_affected": affected, "pids": pids,
                        "recovery_s": None if recovery is None else round(recovery, 2), "other_ok": ok, "other_requests": n})
            print(f"node_chaos: kill {i + 1}/{kills}: shards {lost} ({len(pids)} processes), answered again in "
                  f"{out[-1]['recovery_s']} s; other tenant {ok}/{n}", flush=True)
    finally:
        for c in probes.values():
            c.close()
    return out


def gcs_outage(nodes: Any, seconds: float) -> dict[str, Any]:
    """Kill the head's GCS for ``seconds`` (under the load), start it again; the window it was down.

    Count the requests of the window with :func:`outage_requests` once the load has stopped: a request
    started during the outage may be answered after it (a chat turn takes seconds), and only then is it
    recorded.
    """
    t0 = time.time()
    pid = nodes.stop_gcs()
    time.sleep(seconds)
    t1 = time.time()
    nodes.start_gcs()
    return {"gcs_pid": pid, "t0": t0, "t1": t1, "down_s": round(t1 - t0, 1)}


def outage_requests(records: list[dict[str, Any]], t0: float, t1: float) -> dict[str, Any]:
    """Requests started inside [t0, t1]: answered ok / sent, in all and by kind."""
    inside = [r for r in records if t0 <= r["t0"] <= t1]
    by_kind: dict[str, dict[str, int]] = {}
    for r in inside:
        row = by_kind.setdefault(r["kind"], {"ok": 0, "requests": 0})
        row["ok"] += r["ok"]
        row["requests"] += 1
    return {"ok": sum(r["ok"] for r in inside), "requests": len(inside), "by_kind": dict(sorted(by_kind.items()))}


def verify(load: Load, tenants: tuple[str, str]) -> dict[str, Any]:
    """Read back every acknowledged memory, experience and session turn (after the load stopped).

    ``*_lost``: the API answered 404 for an acknowledged item; ``*_unverified``: it answered nothing but
    refusals or errors for a minute (see :func:`loadtests.chaos_run.read_back`); both must be 0.
    ``missing_ids`` names each lost or unverified item, so a failed run says which write it was.
    """
    from loadtests.chaos_run import lost_turns, message_count, read_back, unread_sessions

    tally = {"writes": {"missing": 0, "unanswered": 0}, "experiences": {"missing": 0, "unanswered": 0}}
    missing_ids: list[dict[str, str]] = []
    counts: dict[str, int | None] = {}
    for tenant, key in zip(tenants, KEYS):
        with RecallServe(load.base, key, timeout=30.0, retry=NO_RETRY) as rs:
            for kind, get, ids in (("writes", rs.memories.get, load.acked_ids[tenant]),
                                   ("experiences", rs.experiences.get, load.acked_exps[tenant])):
                for item_id in ids:
                    verdict = read_back(get, item_id)
                    if verdict != "stored":
                        tally[kind][verdict] += 1
                        missing_ids.append({"tenant": tenant, "kind": kind, "id": item_id, "verdict": verdict})
            sid = f"node-chaos-{tenant}"
            counts[sid] = message_count(rs, sid, USER)
    return {"acked_writes": sum(map(len, load.acked_ids.values())), "writes_lost": tally["writes"]["missing"],
            "writes_unverified": tally["writes"]["unanswered"],
            "acked_experiences": sum(map(len, load.acked_exps.values())), "experiences_lost": tally["experiences"]["missing"],
            "experiences_unverified": tally["experiences"]["unanswered"],
            "acked_turns": sum(load.turns.values()), "turns_lost": lost_turns(load.turns, counts),
            "sessions_unread": unread_sessions(counts), "message_counts": counts, "missing_ids": missing_ids[:20]}


def nothing_lost(lost: dict[str, Any]) -> bool:
    """No acknowledged write, experience or turn lost, and every one of them read back."""
    return not any(lost[k] for k in ("writes_lost", "writes_unverified", "experiences_lost", "experiences_unverified",
                                     "turns_lost", "sessions_unread"))


def summarise(load: Load, kills: list[dict[str, Any]], lost: dict[str, Any]) -> dict[str, Any]:
    """The report's checks: losses, failures by kind, recovery p50/max, the other tenant's success."""
    by_kind: dict[str, dict[str, Any]] = {}
    for r in load.records:
        row = by_kind.setdefault(r["kind"], {"ok": 0, "failed": {}})
        if r["ok"]:
            row["ok"] += 1
        else:
            row["failed"][r["fail"]] = row["failed"].get(r["fail"], 0) + 1
    rs = [k["recovery_s"] for k in kills if k["recovery_s"] is not None]
    other_ok, other_n = sum(k["other_ok"] for k in kills), sum(k["other_requests"] for k in kills)
    return {"requests": len(load.records), "failed": sum(1 for r in load.records if not r["ok"]), "by_kind": by_kind, **lost,
            "recovery_p50_s": round(statistics.median(rs), 2) if rs else None, "recovery_max_s": max(rs) if rs else None,
            "not_recovered": len(kills) - len(rs), "other_ok": other_ok, "other_requests": other_n,
            "other_tenant_success_pct": round(100 * other_ok / other_n, 2) if other_n else None,
            "failure_samples": load.samples}


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    from loadtests._cluster import scratch_config
    from recallserve.deployments.config import STATE_DSN_ENV

    scratch = ROOT / ".recallserve" / time.strftime("node-chaos-%Y%m%dT%H%M%S", time.gmtime())
    redis = RedisServer(scratch / "redis") if args.gcs_outage else None
    ray_opts: dict[str, Any] = {"temp_dir": str(scratch / "ray"), "nodes": args.nodes, "ingress": "proxy"}
    if redis is not None:
        ray_opts["redis_address"] = redis.address
    state: dict[str, Any] = {}
    if args.state_dsn:
        # NOTE: through the environment, as `recallserve up --state-dsn` (inherited by every raylet's workers).
        os.environ[STATE_DSN_ENV] = args.state_dsn
        state = {"state_db": {"dsn_env": STATE_DSN_ENV}}
    config = scratch_config(args.profile, args.port, scratch, args.model, ray=ray_opts, **state)
    os.environ["RECALLSERVE_API_KEYS"] = tenant_keys_env(config.memory.num_shards)

    from recallserve.deployments import runner

    runner.prepare_models(config, progress=False)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    gcs: dict[str, Any] | None = None
    try:
        if redis is not None:
            redis.start()
        runner.start_ray(config)
        runner.deploy(config, timeout_s=900)
        nodes = runner.local_nodes()
        assert nodes is not None
        from recallserve.deployments.cluster_status import cluster_status, render_status

        status_at_start = cluster_status()
        print(render_status(status_at_start), flush=True)
        load, tenants, homes, thread = start_load(config, args.port)
        print(f"node_chaos: {args.nodes} nodes up; tenants {tenants} on shards {homes}; {args.kills} kills", flush=True)
        kills = kill_nodes(config, nodes, load, tenants, homes, args.kills, args.every, args.recovery_timeout)
        if args.gcs_outage:
            time.sleep(5)
            gcs = gcs_outage(nodes, args.gcs_outage)
            time.sleep(10)
            after = cluster_status()
            gcs["nodes_alive_after"] = sum(n["alive"] for n in after["nodes"])
            gcs["replicas_alive_after"] = sum(r["state"] == "ALIVE" for r in after["replicas"])
        time.sleep(min(args.every, 15))
        load.stop.set()
        thread.join(timeout=120)
        lost = verify(load, tenants)
        if gcs is not None:
            gcs.update(outage_requests(load.records, gcs["t0"], gcs["t1"]))
            print(f"node_chaos: GCS down {gcs['down_s']} s: {gcs['ok']}/{gcs['requests']} answered", flush=True)
    finally:
        runner.shutdown()
        if redis is not None:
            redis.stop()
    report = {"meta": {"started_utc": started, "profile": args.profile, "model": args.model, "nodes": args.nodes,
                       "every": args.every, "seed": args.seed, "tenants": list(tenants), "homes": homes,
                       "command": "python -m loadtests.node_chaos " + " ".join(argv if argv is not None else sys.argv[1:])},
              "status_at_start": status_at_start, "kills": kills, "gcs_outage": gcs, "checks": summarise(load, kills, lost)}
    report["ok"] = nothing_lost(lost)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.with_suffix(".json").write_text(json.dumps(report, indent=2) + "\n")
    args.out.with_suffix(".md").write_text(render_markdown(report))
    print(render_markdown(report))
    return 0 if report["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
