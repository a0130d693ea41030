"""``recallserve bench ingest --url``: memories/s of ``POST /v1/memories`` through a running cluster,
and what ingestion does meanwhile to a memory search and a chat turn.

The in-process form of ``bench ingest`` times the memory API alone; this one goes through what a
client pays: the Ray Serve proxy, the ingress, the embedder deployment (its bulk lane, see
``recallserve.deployments.memory.EmbedderDeployment``), the shard deployments, fsync'ed WALs. Phases, one
after the other, each against the same cluster:

1. ``alone``: ``--probes`` memory searches (one LoCoMo question each, one at a time) and, with
   ``--chat``, ``--chat-turns`` chat turns (``agent: off``, temperature 0, ``--chat-tokens``
   tokens), with nothing else running: the latency a user gets from an idle cluster.
2. ``ingest``: ``--batches`` batches of ``--batch`` memories, one request at a time (as the
   seeding of ``bench search``): memories/s (wall, whole phase), median seconds per batch, CPU ms
   per memory of every Ray process of the machine (by title, as ``bench search``), and the
   server-side means from ``/metrics`` (ingress route, embed call, embed forward of each lane,
   shard call).
3. ``ingest+probes``: ingestion again, while the search prober runs (a search, then
   ``--probe-gap-s`` of pause) and, with ``--chat``, the chat turns run one after another; the
   ingestion goes on until the chat turns are answered (at least ``--batches`` batches), so every
   turn runs against ingestion. Latencies here against phase 1 say what ingestion costs a user.

Texts are LoCoMo turns (``--locomo``), never the same text twice within a run (past the file's
end each text gets a ``[cycle n]`` suffix), so the cost per memory is the one of real
conversation turns. Memories go to the key's tenant with the topic ``bench/ingest``.
"""

from __future__ import annotations

import argparse
import asyncio
import itertools
import os
import statistics
import time
from collections.abc import Iterator
from typing import Any

from recallserve.deployments.cli import UserError
from recallserve.deployments.cli._bench_search import _cpu_seconds, _quantile, _ray_processes, cpu_per_answer
from recallserve.deployments.cli._bench_search import _sums as search_sums
from recallserve.client import AsyncRecallServe, RecallServeError
from recallserve.deployments.cli._cluster_client import async_client, cluster_base

__all__ = ["INGEST_SPLIT", "add_cluster_phase_arguments", "locomo_texts", "run_cluster", "split_ms", "render"]

#: split name -> (histogram family, its labels) read from ``/metrics`` before and after a phase.
INGEST_SPLIT: dict[str, tuple[str, dict[str, str]]] = {
    "ingress": ("recallserve_http_request_seconds", {"route": "/v1/memories", "method": "POST"}),
    **{hop: ("recallserve_memory_hop_seconds", {"hop": hop})
       for hop in ("embed_call", "embed_forward", "embed_bulk_forward", "shard_call")},
}


def add_cluster_phase_arguments(p: argparse.ArgumentParser | argparse._ArgumentGroup) -> None:
    """The phases' own arguments (see the module docstring); ``--url`` / ``--key`` come from ``add_cluster_arguments``."""
    p.add_argument("--label", default="cluster", help="names the configuration in the table (default: cluster)")
    p.add_argument("--batches", type=int, default=20, help="batches per ingest phase (default: 20)")
    p.add_argument("--probes", type=int, default=20, help="memory searches timed on an idle cluster (default: 20)")
    p.add_argument("--probe-gap-s", type=float, default=0.25, help="pause between searches during ingestion (default: 0.25)")
    p.add_argument("--chat", default=None, help="a chat question timed alone and during ingestion (default: none)")
    p.add_argument("--chat-turns", type=int, default=1, help="chat turns per phase (default: 1)")
    p.add_argument("--chat-tokens", type=int, default=32, help="max_tokens of a chat turn (default: 32)")


def locomo_texts(path: str) -> Iterator[str]:
    """LoCoMo turn texts, distinct, endlessly: past the file's end, ``"<text> [cycle n]"``."""
    # NOTE: here, not at the top: the retrieval package imports torch, and ``recallserve --help``
    # imports every command module.
    from recallserve.memory_shards.retrieval.locomo import load_locomo

    turns = list(dict.fromkeys(t.text for c in load_locomo(path) for t in c.turns if t.text.strip()))
    if not turns:
        raise UserError(f"--locomo: {path} holds no turn texts")
    for cycle in itertools.count():
        for text in turns:
            yield text if cycle == 0 else f"{text} [cycle {cycle}]"


def _sums(page: str) -> dict[str, tuple[float, float]]:
    """``{split name: (sum, count)}`` of the :data:`INGEST_SPLIT` histograms in a Prometheus text page."""
    return search_sums(page, INGEST_SPLIT)


def split_ms(before: dict[str, tuple[float, float]], after: dict[str, tuple[float, float]]) -> dict[str, float | None]:
    """Mean ms per :data:`INGEST_SPLIT` name between two scrapes, None where nothing was observed.

    mean = (sum_after - sum_before) / (count_after - count_before) * 1000; ``<name>_n`` is the count.
    """
    out: dict[str, float | None] = {}
    for name in INGEST_SPLIT:
        s0, c0 = before.get(name, (0.0, 0.0))
        s1, c1 = after.get(name, (0.0, 0.0))
        out[f"{name}_ms"] = round(1e3 * (s1 - s0) / (c1 - c0), 1) if c1 > c0 else None
        out[f"{name}_n"] = c1 - c0
    return out


async def _scrape(http: AsyncRecallServe) -> dict[str, tuple[float, float]]:
    try:
        return _sums(await http.metrics())
    except RecallServeError:
        return {}


async def _search(http: AsyncRecallServe, query: str) -> float:
    t0 = time.perf_counter()
    try:
        await http.memories.search(query, k=10)
    except RecallServeError as exc:
        raise UserError(f"POST /v1/memories/search: {exc}") from None
    return 1e3 * (time.perf_counter() - t0)


async def _chat(http: AsyncRecallServe, question: str, max_tokens: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    try:
        answer = await http.chat([{"role": "user", "content": question}], max_tokens=max_tokens, temperature=0,
                                 metadata={"agent": "off"})
    except RecallServeError as exc:
        raise UserError(f"POST /v1/chat/completions: {exc}") from None
    wall = time.perf_counter() - t0
    return {"wall_s": round(wall, 2), "completion_tokens": answer.usage.completion_tokens,
            "prompt_tokens": answer.usage.prompt_tokens}


def _latency(ms: list[float]) -> dict[str, Any]:
    return {"n": len(ms), "p50_ms": _quantile(ms, 0.5), "p95_ms": _quantile(ms, 0.95),
            "max_ms": max(ms) if ms else None}


async def _ingest(http: AsyncRecallServe, texts: Iterator[str], batches: int, batch: int, until: asyncio.Event | None) -> dict[str, Any]:
    """Post batches one at a time (at least ``batches``; with ``until``, also until it is set)."""
    before, pids = await _scrape(http), _ray_processes()
    cpu0 = _cpu_seconds(pids)
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < batches or (until is not None and not until.is_set()):
        memories = [{"text": next(texts), "kind": "message", "topic": "bench/ingest"} for _ in range(batch)]
        t0 = time.perf_counter()
        try:
            ids = (await http.memories.add(memories)).ids
        except RecallServeError as exc:
            raise UserError(f"POST /v1/memories: {exc}") from None
        times.append(time.perf_counter() - t0)
        if len(ids) != batch:
            raise UserError(f"POST /v1/memories: {len(ids)} ids for {batch} memories")
    wall = time.perf_counter() - start
    cpu1, after = _cpu_seconds(pids), await _scrape(http)
    memories = batch * len(times)
    cpu_ms = cpu_per_answer(pids, cpu0, cpu1, memories)
    return {"batches": len(times), "memories": memories, "wall_s": round(wall, 2),
            "memories_per_s": round(memories / wall, 1), "median_batch_s": round(statistics.median(times), 3),
            "best_batch_s": round(min(times), 3), "cpu_ms_per_memory": cpu_ms,
            "cpu_ms_per_memory_total": round(sum(cpu_ms.values()), 2), "split": split_ms(before, after)}


async def _phases(args: argparse.Namespace, base: str) -> dict[str, Any]:
    from recallserve.memory_shards.retrieval.locomo import load_locomo

    questions = [q.question for c in load_locomo(args.locomo) for q in c.questions] or ["What happened?"]
    texts = locomo_texts(args.locomo)
    qs = itertools.cycle(questions)
    async with async_client(base, args.key, 600.0) as http:
        await _ingest(http, texts, 2, args.batch, None)  # NOTE: warm-up (first-call costs), not reported
        alone = {"search": _latency([await _search(http, next(qs)) for _ in range(args.probes)])}
        if args.chat:
            alone["chat"] = [await _chat(http, args.chat, args.chat_tokens) for _ in range(args.chat_turns)]
        ingest = await _ingest(http, texts, args.batches, args.batch, None)
        print(f"ingest: {ingest['memories_per_s']} memories/s, median batch {ingest['median_batch_s']} s", flush=True)
        done, search_ms, chats = asyncio.Event(), [], []

        async def prober() -> None:
            while not done.is_set():
                search_ms.append(await _search(http, next(qs)))
                await asyncio.sleep(args.probe_gap_s)

        async def chatter() -> None:
            for _ in range(args.chat_turns):
                chats.append(await _chat(http, args.chat, args.chat_tokens))

        chat_done = asyncio.Event()

        async def chat_then_signal() -> None:
            try:
                await chatter()
            finally:
                chat_done.set()

        tasks = [asyncio.create_task(prober())]
        if args.chat:
            tasks.append(asyncio.create_task(chat_then_signal()))
        try:
            mixed = await _ingest(http, texts, args.batches, args.batch, chat_done if args.chat else None)
        finally:
            done.set()
            await asyncio.gather(*tasks)
        mixed["search"] = _latency(search_ms)
        if args.chat:
            mixed["chat"] = chats
    return {"url": base, "batch": args.batch, "alone": alone, "ingest": ingest, "ingest_with_probes": mixed}


def run_cluster(args: argparse.Namespace, command: str) -> dict[str, Any]:
    """Run the three phases against ``args.url``; the report (see the module docstring)."""
    if args.batches < 1 or args.probes < 1 or args.chat_turns < 1 or args.probe_gap_s < 0:
        raise UserError("--batches, --probes and --chat-turns must be >= 1 and --probe-gap-s >= 0")
    load_before = os.getloadavg()
    report = asyncio.run(_phases(args, cluster_base(args.url)))
    report.update(command=command, time=time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), cpus=os.cpu_count(),
                  load_avg_1m_before_after=[round(load_before[0], 2), round(os.getloadavg()[0], 2)])
    return report


def _chat_s(turns: list[dict[str, Any]] | None) -> str:
    return " / ".join(f"{t['wall_s']:.1f}" for t in turns) if turns else "-"


def _ms(x: float | None) -> str:
    return "-" if x is None else f"{x:.0f}"


def render(reports: list[tuple[str, dict[str, Any]]]) -> str:
    """Markdown: per labelled report, ingestion alone and with probes, the probes' latency alone /
    during ingestion and the server-side split; then CPU ms per memory by process."""
    lines = ["| config | memories/s | median s/batch | CPU ms/memory | ingress ms | embed call ms | embed forward ms "
             "| shard call ms | memories/s with probes | search p50 ms alone / during | search p95 ms alone / during "
             "| chat s alone | chat s during |", "|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for label, r in reports:
        a, i, m = r["alone"], r["ingest"], r["ingest_with_probes"]
        sp = i["split"]
        forward = sp.get("embed_bulk_forward_ms") or sp.get("embed_forward_ms")
        lines.append(f"| {label} | {i['memories_per_s']} | {i['median_batch_s']} | {i['cpu_ms_per_memory_total']} "
                     f"| {_ms(sp.get('ingress_ms'))} | {_ms(sp.get('embed_call_ms'))} | {_ms(forward)} "
                     f"| {_ms(sp.get('shard_call_ms'))} | {m['memories_per_s']} "
                     f"| {_ms(a['search']['p50_ms'])} / {_ms(m['search']['p50_ms'])} "
                     f"| {_ms(a['search']['p95_ms'])} / {_ms(m['search']['p95_ms'])} "
                     f"| {_chat_s(a.get('chat'))} | {_chat_s(m.get('chat'))} |")
    lines += ["", "CPU ms per memory (ingest phase) by process:", "", "| config | by process |", "|---|---|"]
    for label, r in reports:
        top = ", ".join(f"{t.removeprefix('ray::')} {v:.1f}" for t, v in list(r["ingest"]["cpu_ms_per_memory"].items())[:6])
        lines.append(f"| {label} | {top} |")
    return "\n".join(lines) + "\n"
