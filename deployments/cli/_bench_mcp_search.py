"""``recallserve bench mcp-search``: a memory search through ``/mcp`` against the same search through
REST, on one running server, in the same run.

The tenant of ``--key`` first gets ``--memories`` memories (LoCoMo-derived texts, through the
client). Then each query is asked both ways, one at a time, the order alternating per query so
neither path always runs on a warmer cache: REST with :class:`recallserve.client.AsyncRecallServe`
(``memories.search``), MCP with the official MCP Python client over streamable HTTP
(``tools/call search_memories``, one initialised session). Both time the whole client call
(request, answer, decoding). Reported: p50 / p90 / mean of each, and the ratio of the p50s
(the issue's target: at most 1.2). The two answers' ids are compared per query.
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
    p = subparsers.add_parser(NAME, help="memory search p50 through /mcp against REST, same server, same run")
    add_cluster_arguments(p)
    p.add_argument("--locomo", required=True, help="LoCoMo-format JSON: the source of texts and questions")
    p.add_argument("--memories", type=int, default=2000, help="memories added to the key's tenant first (default 2000)")
    p.add_argument("--queries", type=int, default=300, help="timed queries, each asked both ways (default 300)")
    p.add_argument("--warmup", type=int, default=20, help="untimed queries first, both ways (default 20)")
    p.add_argument("--k", type=int, default=16, help="results per search (default 16)")
    add_out_argument(p, NAME)
    p.set_defaults(func=run)


def _stats(ms: list[float]) -> dict[str, float]:
    a = np.asarray(ms)
    return {"p50_ms": round(float(np.percentile(a, 50)), 3), "p90_ms": round(float(np.percentile(a, 90)), 3),
            "mean_ms": round(float(a.mean()), 3)}


async def _measure(base: str, key: str, texts: list[str], questions: list[str], args: argparse.Namespace) -> dict[str, Any]:
    auth = {"Authorization": f"Bearer {key}"}
    async with AsyncRecallServe(base, key, timeout=60.0) as rest, httpx.AsyncClient(headers=auth, timeout=60.0) as http:
        for start in range(0, args.memories, 200):
            await rest.memories.add([{"text": texts[i % len(texts)], "source_id": f"mcp-bench:{i}"}
                                     for i in range(start, min(start + 200, args.memories))])
        async with streamable_http_client(f"{base}/mcp", http_client=http) as (read, write, _):
            async with ClientSession(read, write) as mcp:
                await mcp.initialize()
                times: dict[str, list[float]] = {"rest": [], "mcp": []}
                same = 0
                for i in range(args.warmup + args.queries):
                    body = {"query": questions[i % len(questions)], "k": args.k}
                    got: dict[str, list[str]] = {}
                    for path in (("rest", "mcp") if i % 2 == 0 else ("mcp", "rest")):
                        start = time.perf_counter()
                        if path == "rest":
                            got[path] = [h.id for h in (await rest.memories.search(**body)).data]
                        else:
                            result = await mcp.call_tool("search_memories", body)
                            if result.isError:
                                raise RuntimeError(f"search_memories failed: {result.content}")
                            got[path] = [h["id"] for h in (result.structuredContent or {})["data"]]
                        if i >= args.warmup:
                            times[path].append((time.perf_counter() - start) * 1000)
                    same += i >= args.warmup and got["rest"] == got["mcp"]
    rest_s, mcp_s = _stats(times["rest"]), _stats(times["mcp"])
    return {"rest": rest_s, "mcp": mcp_s, "p50_ratio_mcp_over_rest": round(mcp_s["p50_ms"] / rest_s["p50_ms"], 3),
            "same_results": f"{same}/{args.queries}"}


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
           "client": "recallserve.client (REST), mcp official Python client (streamable HTTP), sequential, alternating order",
           **asyncio.run(_measure(base, args.key, texts, questions, args))}
    print(json.dumps(row))
    write_report(args, row)
    return 0
