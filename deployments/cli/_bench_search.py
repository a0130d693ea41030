"""``recallserve bench search``: memory search latency and throughput through the running cluster.

Writes ``--memories`` memories for one tenant through ``POST /v1/memories`` (batches of 50; skipped
when the tenant already holds that many from an earlier run with the same ``--tag``), then for each
``--clients`` level runs that many closed-loop clients sending ``POST /v1/memories/search`` for
``--seconds`` and reports answers/s, p50 / p95 / p99 latency and the status counts (a 503 or 429
with ``Retry-After`` is the cluster refusing load, not an error of the benchmark: the client waits
as told, at most until the level ends, as a well-behaved client would, and the refusals' own latency
is reported as ``p95_503_ms``). ``refused`` counts the refusals by who sent them
(:func:`refusal_kind`: Ray Serve's ``max_queued_requests``, HAProxy's queue timeout, HAProxy's bound
per API key, the ingress's own search admission), and ``no_retry_after`` those without the header;
``refused_p95_ms`` gives each sender's refusal latency.

Where the time goes: the cluster's ``/metrics`` is read before and after each level, and the
change of each histogram's sum / count gives the level's mean server-side times (``split``):
``ingress`` (the search route inside the ingress), ``search`` (embed + shard fan-out + fusion),
``embed_call`` / ``shard_call`` (a hop as the ingress waits for it) and ``embed_forward`` /
``shard_search`` (the work inside the replica); ``embed_batch`` is embed calls per forward pass.
Client latency minus ``ingress`` is the Ray proxy's share (HTTP, routing to the ingress).

On shared cores wall times say more about the neighbours than about the cluster, so each level
also reports CPU ms per answer (``cpu_ms``) of every Ray process on this machine (by its title:
``ray::ServeReplica:<app>:embedder``, ``ray::ProxyActor`` ...) and of the benchmark client itself,
from the change of their CPU times (user + system) over the level.

Everything goes through the Ray Serve proxy, so the figures include what a client pays: HTTP,
the ingress, the embedder deployment (query embedding), the shards and the fusion.

Example::

    recallserve up &
    recallserve bench search --memories 2000 --clients 1,4,16,64 --seconds 10
"""

from __future__ import annotations

import argparse
import asyncio
import os
import random
import ssl
import statistics
import time
from collections.abc import Callable
from typing import Any

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_args import (add_out_argument, add_seconds_argument, check_range, parse_ints,
                                                     write_report)
import recallserve.client._calls as calls
from recallserve.client import AsyncRecallServe, ConnectionFailed, RecallServeError, RetryPolicy
from recallserve.deployments.cli._cluster_client import add_cluster_arguments, async_client, cluster_base
from recallserve.memory_shards.bench import query_text, ticket_text

__all__ = ["SPLIT", "add_parser", "answer_status", "cpu_per_answer", "refusal_kind", "render", "run", "split_means"]

NAME = "search"

#: split name -> (histogram family, its labels) read from ``/metrics`` (see the module docstring).
SPLIT: dict[str, tuple[str, dict[str, str]]] = {
    "ingress": ("recallserve_http_request_seconds", {"route": "/v1/memories/search", "method": "POST"}),
    "search": ("recallserve_memory_search_seconds", {"caller": "api"}),
    **{hop: ("recallserve_memory_hop_seconds", {"hop": hop})
       for hop in ("embed_call", "embed_forward", "shard_call", "shard_search")},
}


def _sums(text: str, split: dict[str, tuple[str, dict[str, str]]] | None = None) -> dict[str, tuple[float, float]]:
    """``{split name: (sum, count)}`` of the ``split`` histograms (default :data:`SPLIT`) in a Prometheus text page."""
    from prometheus_client.parser import text_string_to_metric_families

    out: dict[str, tuple[float, float]] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            for name, (metric, labels) in (SPLIT if split is None else split).items():
                if sample.name in (f"{metric}_sum", f"{metric}_count") and labels.items() <= sample.labels.items():
                    total, count = out.get(name, (0.0, 0.0))
                    out[name] = (total + sample.value, count) if sample.name.endswith("_sum") else (total, count + sample.value)
    return out


def split_means(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float | None]:
    """Mean ms per :data:`SPLIT` name between two scrapes (None where nothing was observed), and ``embed_batch``.

    mean = (sum_after - sum_before) / (count_after - count_before) * 1000;
    embed_batch = embed_call calls / embed_forward passes in the same interval.
    """
    out: dict[str, float | None] = {}
    counts: dict[str, float] = {}
    for name in SPLIT:
        s0, c0 = before.get(name, (0.0, 0.0))
        s1, c1 = after.get(name, (0.0, 0.0))
        counts[name] = c1 - c0
        out[f"{name}_ms"] = 1e3 * (s1 - s0) / (c1 - c0) if c1 > c0 else None
    forwards = counts["embed_forward"]
    out["embed_batch"] = counts["embed_call"] / forwards if forwards > 0 else None
    return out


def _ray_processes() -> dict[int, str]:
    """pid -> title of this machine's Ray processes (``ray::...``, raylet, gcs_server) and of this benchmark."""
    import psutil

    out = {os.getpid(): "bench client"}
    for proc in psutil.process_iter(["cmdline"]):
        cmd = proc.info.get("cmdline") or []
        if cmd and cmd[0].startswith("ray::"):
            out[proc.pid] = cmd[0].split()[0].split(".")[0]  # NOTE: an actor's title ends with its current method
        elif cmd and os.path.basename(cmd[0]) in ("raylet", "gcs_server"):
            out[proc.pid] = os.path.basename(cmd[0])
    return out


def _cpu_seconds(pids: dict[int, str]) -> dict[int, float]:
    import psutil

    out = {}
    for pid in pids:
        try:
            t = psutil.Process(pid).cpu_times()
            out[pid] = t.user + t.system
        except (psutil.NoSuchProcess, psutil.AccessDenied):
            pass
    return out


def cpu_per_answer(pids: dict[int, str], before: dict[int, float], after: dict[int, float],
                   answers: int) -> dict[str, float]:
    """CPU ms per answer by process title (processes of one title summed), largest first; {} with no answers.

    cpu_ms[title] = 1000 * sum over its pids of (cpu_after - cpu_before) / answers.
    """
    if answers <= 0:
        return {}
    by_title: dict[str, float] = {}
    for pid, title in pids.items():
        if pid in before and pid in after:
            by_title[title] = by_title.get(title, 0.0) + 1e3 * (after[pid] - before[pid]) / answers
    return dict(sorted(((t, round(v, 2)) for t, v in by_title.items() if v >= 0.005), key=lambda kv: -kv[1]))


async def _scrape(http: AsyncRecallServe) -> dict[str, tuple[float, float]]:
    try:
        return _sums(await http.metrics())
    except RecallServeError:
        return {}


def answer_status(exc: RecallServeError) -> str:
    """The status a level counts: the HTTP status, or the transport failure's name (no answer)."""
    return exc.reason if isinstance(exc, ConnectionFailed) else str(exc.status)


def refusal_kind(body: str) -> str:
    """Who refused a search: ``proxy`` (Ray Serve's backpressure text), ``haproxy_queue`` (HAProxy's queue
    timeout, a 503), ``per_key`` (HAProxy's bound on one API key's requests in flight, a 429),
    ``memory_overloaded`` (the ingress's search admission), ``chat_overloaded`` (its chat admission) or ``other``."""
    if "Request dropped due to backpressure" in body:
        return "proxy"
    for code, kind in (("ingress_unavailable", "haproxy_queue"), ("too_many_requests_in_flight", "per_key"),
                       ("memory_overloaded", "memory_overloaded"), ("chat_overloaded", "chat_overloaded")):
        if code in body:
            return kind
    return "other"


#: Seeding waits out a shard that is still loading (503 + Retry-After) up to 60 times.
SEED_RETRY = RetryPolicy(max_retries=60, backoff_s=1.0, max_backoff_s=30.0)


def _quantile(values: list[float], q: float) -> float | None:
    if not values:
        return None
    s = sorted(values)
    return s[min(len(s) - 1, int(q * len(s)))]


async def _seed(http: AsyncRecallServe, n: int, tag: str, rng: random.Random) -> float:
    """Write ``n`` memories tagged ``tag`` unless they are there; seconds spent writing."""
    try:
        # NOTE: a shard still loading a big folder answers 503; seeding then would rewrite every row through
        # the API: up to 60 waits of its Retry-After.
        have = await http.send(calls.list_memories(f"bench-search-{tag}-{n - 1}"), retry=SEED_RETRY)
        if have.data:
            return 0.0
        start = time.perf_counter()
        for lo in range(0, n, 50):
            await http.memories.add([{"text": ticket_text(rng, i), "source_id": f"bench-search-{tag}-{i}",
                                      "topic": "bench/search"} for i in range(lo, min(n, lo + 50))])
    except RecallServeError as exc:
        raise UserError(f"seeding: {exc}") from None
    return time.perf_counter() - start


async def _flood(connect: Callable[[], AsyncRecallServe], clients: int, stop: float, rng: random.Random) -> dict[str, int]:
    """``clients`` closed-loop clients of another tenant until ``stop``; their status counts.

    They ignore ``Retry-After`` as a misbehaving client would, pausing only 50 ms after a refusal so
    the benchmark's own Python does not take the 2 cores from the cluster it measures.
    """
    statuses: dict[str, int] = {}

    async def one() -> None:
        async with connect() as http:
            while time.perf_counter() < stop:
                query = query_text(rng)
                try:
                    await http.memories.search(query, k=10)
                    status = "200"
                except RecallServeError as exc:  # NOTE: a transport failure is counted too, not raised
                    status = answer_status(exc)
                statuses[status] = statuses.get(status, 0) + 1
                if status != "200":
                    await asyncio.sleep(0.05)

    await asyncio.gather(*(one() for _ in range(clients)))
    return statuses


async def _level(http: AsyncRecallServe, clients: int, seconds: float, rng: random.Random,
                 connect: Callable[[], AsyncRecallServe] | None = None,
                 flood: tuple[Callable[[], AsyncRecallServe], int] | None = None) -> dict[str, Any]:
    """One level: ``clients`` closed-loop clients for ``seconds``, each on its own connection (``connect()``),
    beside ``flood`` = (its ``connect``, clients): another tenant's flood (:func:`_flood`), started first.

    NOTE: one connection per client, as separate users have: 64 clients sharing one httpx pool
    cost the benchmark itself 21-24 ms of CPU per answer on the same 2 cores (a third of the
    cluster's own cost), 5.5 ms with a connection each.
    """
    latencies: list[float] = []
    refused: list[float] = []
    statuses: dict[str, int] = {}
    kinds: dict[str, int] = {}
    kind_ms: dict[str, list[float]] = {}
    stop = time.perf_counter() + seconds

    async def client() -> None:
        if connect is None:
            await _client_loop(http)
            return
        async with connect() as own:
            await _client_loop(own)

    async def _client_loop(http: AsyncRecallServe) -> None:
        while time.perf_counter() < stop:
            query = query_text(rng)
            t0 = time.perf_counter()
            wait = 0.0
            try:
                await http.memories.search(query, k=10)
                status = "200"
            except RecallServeError as exc:  # NOTE: a transport failure is counted too, not raised
                status = answer_status(exc)
                if exc.status in (429, 503):
                    wait = exc.retry_after_s if exc.retry_after_s is not None else 1.0
                    kind = refusal_kind(f"{exc.code} {exc.message}"[:500])
                    kinds[kind] = kinds.get(kind, 0) + 1
                    kind_ms.setdefault(kind, []).append(1e3 * (time.perf_counter() - t0))
                    if exc.retry_after_s is None:
                        kinds["no_retry_after"] = kinds.get("no_retry_after", 0) + 1
            elapsed = time.perf_counter() - t0
            if status == "200":
                latencies.append(elapsed)
            elif status in ("429", "503"):
                refused.append(elapsed)
            statuses[status] = statuses.get(status, 0) + 1
            if wait:
                await asyncio.sleep(min(wait, max(0.0, stop - time.perf_counter())))

    flooding = None
    if flood is not None:
        flooding = asyncio.ensure_future(_flood(flood[0], flood[1], stop, random.Random(rng.random())))
        await asyncio.sleep(min(1.0, seconds / 4))  # NOTE: the flood holds its slots before the level is timed
    before = await _scrape(http)
    pids = _ray_processes()
    cpu0 = _cpu_seconds(pids)
    start = time.perf_counter()
    await asyncio.gather(*(client() for _ in range(clients)))
    wall = time.perf_counter() - start
    flood_statuses = await flooding if flooding is not None else None
    cpu1 = _cpu_seconds(pids)
    after = await _scrape(http)
    cpu_ms = cpu_per_answer(pids, cpu0, cpu1, len(latencies))
    ms = [1e3 * x for x in latencies]
    return {"clients": clients, "answers_per_s": len(ms) / wall, "p50_ms": _quantile(ms, 0.5),
            "p95_ms": _quantile(ms, 0.95), "p99_ms": _quantile(ms, 0.99), "statuses": statuses,
            "mean_ms": statistics.fmean(ms) if ms else None,
            "p95_503_ms": _quantile([1e3 * x for x in refused], 0.95),
            "p50_503_ms": _quantile([1e3 * x for x in refused], 0.5), "refused": kinds,
            "refused_p95_ms": {k: _quantile(v, 0.95) for k, v in kind_ms.items()}, "split": split_means(before, after),
            "cpu_ms": cpu_ms, "cpu_ms_total": round(sum(cpu_ms.values()), 2),
            **({"flood": {"clients": flood[1], "statuses": flood_statuses}} if flood is not None else {})}


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:.{digits}f}"


def render(report: dict[str, Any], title: str | None = None) -> str:
    """A Markdown table of one report: a row per level, then the level's server-side split."""
    head = title or f"`recallserve bench search`, {report['memories']} memories"
    lines = [f"# {head}", "", f"Command: `{report.get('command', '')}` ({report.get('time', '')}); "
             f"load average {report.get('load_average', '-')}.", "",
             "| clients | answers/s | p50 ms | p95 ms | p99 ms | 503 p95 ms | statuses | ingress | search | embed call "
             "| embed fwd | embed batch | shard call | shard search |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for row in report["levels"]:
        sp = row.get("split") or {}
        statuses = " ".join(f"{k}:{v}" for k, v in sorted(row["statuses"].items()))
        if row.get("refused"):
            p95 = row.get("refused_p95_ms") or {}
            statuses += " (503 from " + ", ".join(
                f"{k} {v}" + (f" p95 {p95[k]:.0f} ms" if p95.get(k) is not None else "")
                for k, v in sorted(row["refused"].items())) + ")"
        lines.append(f"| {row['clients']} | {_num(row['answers_per_s'])} | {_num(row['p50_ms'])} | {_num(row['p95_ms'])} "
                     f"| {_num(row['p99_ms'])} | {_num(row.get('p95_503_ms'))} | {statuses} | {_num(sp.get('ingress_ms'))} "
                     f"| {_num(sp.get('search_ms'))} | {_num(sp.get('embed_call_ms'))} | {_num(sp.get('embed_forward_ms'))} "
                     f"| {_num(sp.get('embed_batch'))} | {_num(sp.get('shard_call_ms'))} | {_num(sp.get('shard_search_ms'))} |")
    lines += ["", "CPU ms per answer (all Ray processes of the machine and the benchmark client):", "",
              "| clients | total | by process |", "|---|---|---|"]
    for row in report["levels"]:
        top = ", ".join(f"{t.removeprefix('ray::')} {v:.1f}" for t, v in list((row.get("cpu_ms") or {}).items())[:8])
        lines.append(f"| {row['clients']} | {_num(row.get('cpu_ms_total'))} | {top} |")
    floods = [row for row in report["levels"] if row.get("flood")]
    if floods:
        lines += ["", "Another tenant flooded the cluster during each level (closed loop, `--flood-key`):", "",
                  "| clients | flood clients | flood statuses |", "|---|---|---|"]
        lines += [f"| {row['clients']} | {row['flood']['clients']} | "
                  + " ".join(f"{k}:{v}" for k, v in sorted((row['flood']['statuses'] or {}).items())) + " |"
                  for row in floods]
    lines += ["", "Server-side columns are means in ms from the cluster's /metrics over the level (see "
              "recallserve.deployments.cli._bench_search); '-' where the cluster did not export them."]
    return "\n".join(lines) + "\n"


async def _main(args: argparse.Namespace, base: str) -> dict[str, Any]:
    rng = random.Random(args.seed)
    async with async_client(base, args.key, 60.0, max_connections=max(args.clients) + 4) as http:
        seeded = await _seed(http, args.memories, args.tag, rng)
        if seeded:
            print(f"seeded {args.memories} memories in {seeded:.1f} s ({args.memories / seeded:.1f}/s)", flush=True)
        tls = ssl.create_default_context()  # NOTE: once: ~6 ms of CPU per client otherwise, inside the timed level

        def connect() -> AsyncRecallServe:
            return async_client(base, args.key, 60.0, max_connections=1, verify=tls)

        def connect_flood() -> AsyncRecallServe:
            return async_client(base, args.flood_key, 60.0, max_connections=1, verify=tls)

        flood = (connect_flood, args.flood_clients) if args.flood_key else None
        await _level(http, 1, 2.0, rng, connect)  # NOTE: warm-up, not reported
        levels = []
        for clients in args.clients:
            row = await _level(http, clients, args.seconds, rng, connect, flood)
            print(f"{clients:>3} clients: {row['answers_per_s']:.1f} answers/s, p50 {row['p50_ms'] or 0:.0f} ms, "
                  f"p95 {row['p95_ms'] or 0:.0f} ms, statuses {row['statuses']}"
                  + (f"; flood of {args.flood_clients}: {row['flood']['statuses']}" if flood else ""), flush=True)
            levels.append(row)
    return {"url": base, "memories": args.memories, "seconds": args.seconds, "seeding_s": seeded, "levels": levels,
            "time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "load_average": [round(x, 2) for x in os.getloadavg()]}


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench search``."""
    p = subparsers.add_parser(NAME, help="memory search latency and throughput through the running cluster")
    add_cluster_arguments(p)
    p.add_argument("--memories", type=int, default=2000, help="memories in the tenant (50-1000000, default 2000)")
    p.add_argument("--clients", default="1,4,16,64", help="comma-separated concurrency levels (default 1,4,16,64)")
    add_seconds_argument(p, 10.0, "per level (1-600)")
    p.add_argument("--tag", default="v1", help="names the seeded set, so a rerun reuses it (default v1)")
    p.add_argument("--seed", type=int, default=0, help="random seed of texts and queries")
    p.add_argument("--flood-key", default=None,
                   help="API key of another tenant that floods the cluster with searches during every level (tenant "
                   "isolation: the measured clients' latency and refusals beside the flood)")
    p.add_argument("--flood-clients", type=int, default=48, help="the flood's closed-loop clients (1-256, default 48)")
    add_out_argument(p, NAME, markdown=True)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Seed, time each level, print, write JSON."""
    args.clients = parse_ints("clients", args.clients, 1, 256)
    check_range("flood-clients", args.flood_clients, 1, 256)
    if args.flood_key is not None and args.flood_key == args.key:
        raise UserError("--flood-key: must be another tenant's key than --key")
    check_range("memories", args.memories, 50, 1_000_000)
    check_range("seconds", args.seconds, 1, 600)
    report = asyncio.run(_main(args, cluster_base(args.url)))
    report["command"] = "recallserve " + " ".join(getattr(args, "argv", []))
    write_report(args, report, render(report))
    return 0
