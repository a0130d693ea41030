"""N chat sessions asking at the same moment (issue 37, Deliver 5): success rate, p50/p95, refusals by kind.

Against a running ``recallserve up --demo`` on this machine (``--url``, loopback only): for each
level (``--clients 8 32``) and each kind of turn, that many clients each open a session of their own
and send one question at once, on one API key:

* ``direct``: a question the agent answers without a tool ("What do you help with?");
* ``one_tool``: an order-status question (the demo's ``order_status`` tool, one call).

Each answer is counted by its status; a refusal by who gave it (``refusal_kind`` of
``recallserve bench search``: Ray's proxy plain text, HAProxy's queue or per-key bound, the ingress's
chat or search admission), whether it was the API's JSON error envelope and its ``Retry-After``.
Latency is request sent -> full answer, over all requests (refusals included: a fast refusal shows
as a short time). Requests go through ``recallserve.client`` with retries off (a refusal is what is
counted; the exception carries its status, code, message, envelope and ``Retry-After``). Results:
``--out`` (JSON) and a Markdown table beside it.

Example::

    recallserve up --demo &      # wait for "ready"
    python -m loadtests.chat_concurrency --url http://127.0.0.1:8000 --out loadtests/results/concurrency.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import time
from pathlib import Path
from typing import Any

from loadtests._guard import check_host
from recallserve.client import AsyncRecallServe, RecallServeError
from recallserve.deployments.cli._bench_search import answer_status, refusal_kind
from recallserve.deployments.cli._cluster_client import async_client

QUESTIONS = {
    "direct": "What do you help with? One sentence.",
    "one_tool": "What is the status of order {order}?",
}
ORDERS = ["104208", "104209", "104210", "104211"]


async def _one(client: AsyncRecallServe, kind: str, i: int, run: str) -> dict[str, Any]:
    text = QUESTIONS[kind].format(order=ORDERS[i % len(ORDERS)])
    start = time.perf_counter()
    failed: RecallServeError | None = None
    try:
        await client.chat([{"role": "user", "content": text}], max_tokens=96, user=f"conc-{run}-{i}",
                          metadata={"session_id": f"conc-{run}-{kind}-{i}"})
    except RecallServeError as exc:  # NOTE: a transport failure too (its name is the status)
        failed = exc
    wall = time.perf_counter() - start
    row: dict[str, Any] = {"status": "200" if failed is None else answer_status(failed), "wall_s": round(wall, 2)}
    if failed is not None:
        row["refusal"] = refusal_kind(f"{failed.code} {failed.message}"[:500])
        row["json_envelope"] = failed.enveloped
        row["retry_after"] = failed.retry_after_s if failed.status in (429, 503) else None
    return row


async def _level(url: str, kind: str, clients: int, key: str, timeout_s: float) -> dict[str, Any]:
    run = f"{int(time.time())}-{clients}"
    # NOTE: the benches' client: retries off, so each refusal is what the level counts.
    async with async_client(url, key, timeout_s, max_connections=clients + 4) as client:
        start = time.perf_counter()
        rows = await asyncio.gather(*(_one(client, kind, i, run) for i in range(clients)))
        elapsed = time.perf_counter() - start
    walls = sorted(r["wall_s"] for r in rows)
    ok = sum(r["status"] == "200" for r in rows)
    refusals: dict[str, int] = {}
    for r in rows:
        if r["status"] != "200":
            name = f"{r['status']} {r.get('refusal', '')}".strip()
            refusals[name] = refusals.get(name, 0) + 1
    return {"kind": kind, "clients": clients, "answered": ok, "success_rate": round(ok / clients, 3),
            "p50_s": statistics.median(walls), "p95_s": walls[min(len(walls) - 1, int(0.95 * len(walls)))],
            "elapsed_s": round(elapsed, 1), "refusals": refusals,
            "outside_envelope": sum(1 for r in rows if r["status"] != "200" and not r.get("json_envelope"))}


def _markdown(rows: list[dict[str, Any]], note: str) -> str:
    lines = [f"# Concurrent chat sessions ({note})", "",
             "| kind | clients | answered | success | p50 s | p95 s | all done s | refusals | outside envelope |",
             "|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        refused = ", ".join(f"{k}: {v}" for k, v in r["refusals"].items()) or "none"
        lines.append(f"| {r['kind']} | {r['clients']} | {r['answered']} | {r['success_rate']:.0%} | {r['p50_s']:.1f} | "
                     f"{r['p95_s']:.1f} | {r['elapsed_s']:.1f} | {refused} | {r['outside_envelope']} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--key", default="sk-local")
    parser.add_argument("--clients", type=int, nargs="+", default=[8, 32])
    parser.add_argument("--kinds", nargs="+", choices=sorted(QUESTIONS), default=["direct", "one_tool"])
    parser.add_argument("--timeout-s", type=float, default=600.0)
    parser.add_argument("--note", default="cpu-local, one node")
    parser.add_argument("--out", type=Path, default=Path("loadtests/results/concurrency.json"))
    args = parser.parse_args(argv)
    if any(not 1 <= n <= 256 for n in args.clients):
        parser.error("--clients: each level must be 1..256")
    url = check_host(args.url)
    rows = []
    for clients in args.clients:
        for kind in args.kinds:
            row = asyncio.run(_level(url, kind, clients, args.key, args.timeout_s))
            print(json.dumps(row), flush=True)
            rows.append(row)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps({"note": args.note, "rows": rows}, indent=1) + "\n")
    args.out.with_suffix(".md").write_text(_markdown(rows, args.note))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
