"""``recallserve bench mcp-search``: a memory search through ``/mcp`` against the same search through
REST, on one running server, in the same run.

The tenant of ``--key`` first gets ``--memories`` memories (LoCoMo-derived texts, through the
client). Then each query is asked three ways, one at a time, the order rotating per query so no
path always runs on a warmer cache:

* ``rest``: :class:`recallserve.client.AsyncRecallServe` (``memories.search``: httpx, the answer read
  into ``SearchResponse``);
* ``mcp_raw``: one JSON-RPC ``tools/call search_memories`` POST to ``/mcp`` per query on an httpx
  client with the same settings, the answer's ``structuredContent`` read with ``json`` (what a client
  of the wire format costs: stateless, no session, no ``initialize`` needed);
* ``mcp_sdk``: the official MCP Python client (``ClientSession.call_tool`` over its streamable-HTTP
  transport, one initialised session): what an agent built on the SDK pays, its own JSON-RPC
  machinery (memory streams, a task per message, pydantic models of every message) included.

Each time is the whole client call (request, answer, decoding). Reported: p50 / p90 / mean of each
and the ratio of each MCP p50 to the REST p50 (the issue's target: at most 1.2); the answers' ids are
compared per query.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import platform
import time
from pathlib import Path
from typing import Any

import httpx
import numpy as np
from mcp import ClientSession
from mcp.client.streamable_http import streamable_http_client

from recallserve.client import AsyncRecallServe
from recallserve.deployments.cli._bench_args import add_out_argument, check_range, write_report
from recallserve.deployments.cli._cluster_client import add_cluster_arguments, cluster_base
from recallserve.memory_shards.retrieval.locomo import load_locomo

NAME = "mcp-search"


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``bench mcp-search``."""
    p = subparsers.add_parser(NAME, help="memory search p50 through /mcp (raw JSON-RPC and the official SDK client) against REST, same server, same run")
    add_cluster_arguments(p)
    p.add_argument("--locomo", required=True, help="LoCoMo-format JSON: the source of texts and questions")
    p.add_argument("--memories", type=int, default=2000, help="memories added to the key's tenant first (default 2000)")
    p.add_argument("--queries", type=int, default=300, help="timed queries, each asked the three ways (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="untimed queries first, the three ways (default 20)")
    p.add_argument("--k", type=int, default=16, help="results per search (default 16)")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def _stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p90_ms": round(float(np.percentile(a, 90)), 3),
            "mean_ms": round(float(a.mean()), 3)}


PATHS = ("rest", "mcp_raw", "mcp_sdk")


async def _measure(base: str, key: str, texts: list[str], questions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {key}"}
    accept = {"accept": "application/json, text/event-stream"}
    async with AsyncRecallServe(base, key, timeout=60.0) as rest, httpx.AsyncClient(headers=auth, timeout=60.0) as http, \
            httpx.AsyncClient(base_url=base, headers={**auth, **accept}, timeout=60.0) as raw:
        for start in range(0, args.memories, 200):
            await rest.memories.add([{"text": texts[i % len(texts)], "source_id": f"mcp-bench:{i}"}
                                     for i in range(start, min(start + 200, args.memories))])
        async with streamable_http_client(f"{base}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as sdk:
                await sdk.initialize()

                async def ask(path: str, body: dict[str, Any], n: int) -> list[str]:
                    if path == "rest":
                        return [h.id for h in (await rest.memories.search(**body)).data]
                    if path == "mcp_raw":
                        answer = await raw.post("/mcp", json={"jsonrpc": "2.0", "id": n, "method": "tools/call",
                                                              "params": {"name": "search_memories", "arguments": body}})
                        answer.raise_for_status()
                        result = answer.json()["result"]
                        failed, structured = result.get("isError"), result.get("structuredContent")
                    else:
                        called = await sdk.call_tool("search_memories", body)
                        failed, structured = called.isError, called.structuredContent
                    if failed or structured is None:
                        raise RuntimeError(f"search_memories through {path} failed")
                    return [h["id"] for h in structured["data"]]

                times: dict[str, list[float]] = {p: [] for p in PATHS}
                same = {p: 0 for p in PATHS[1:]}
                for i in range(args.warmup + args.queries):
                    body = {"query": questions[i % len(questions)], "k": args.k}
                    got: dict[str, list[str]] = {}
                    for path in PATHS[i % 3:] + PATHS[:i % 3]:
                        start = time.perf_counter()
                        got[path] = await ask(path, body, i)
                        if i >= args.warmup:
                            times[path].append((time.perf_counter() - start) * 1000)
                    for p in same:
                        same[p] += i >= args.warmup and got[p] == got["rest"]
    stats = {p: _stats(times[p]) for p in PATHS}
    return {**stats, **{f"p50_ratio_{p}_over_rest": round(stats[p]["p50_ms"] / stats["rest"]["p50_ms"], 3) for p in PATHS[1:]},
            "same_results_as_rest": {p: f"{n}/{args.queries}" for p, n in same.items()}}


def run(args: argparse.Namespace) -> int:
    """Add the memories, time both paths, print and write the JSON row."""
    check_range("memories", args.memories, 1, 1_000_000)
    check_range("queries", args.queries, 1, 100_000)
    check_range("warmup", args.warmup, 0, 10_000)
    check_range("k", args.k, 1, 200)
    base = cluster_base(args.url)
    convs = load_locomo(args.locomo)
    texts = [t.text for c in convs for t in c.turns if t.text.strip()]
    questions = [q.question for c in convs for q in c.questions]
    row = {"bench": "mcp_search_vs_rest", "url": base, "locomo": Path(args.locomo).name, "memories_added": args.memories,
           "queries": args.queries, "k": args.k, "machine": platform.node(), "python": platform.python_version(),
           "client": ("rest: recallserve.client; mcp_raw: JSON-RPC POSTs on httpx; mcp_sdk: the official MCP Python "
                      "client (streamable HTTP, one session); sequential, the order rotating per query"),
           **asyncio.run(_measure(base, args.key, texts, questions, args))}
    print(json.dumps(row))
    write_report(args, row)
    return 0
