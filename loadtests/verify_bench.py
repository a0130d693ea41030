"""What a hostile experience record costs the other requests of a replica: p50 with and without.

Issue 14: one record whose check computed ``round(5, -10**7)`` held the ingress event loop for
6 s, and ``/healthz`` on that replica waited 5.5 s. Verification is now capped per step and per
record and runs in a worker process (``verify_workers``). This builds the real ingress app in process (``create_app``
with the experience router; the engine is never called, nothing listens on a port), and in one
run times ordinary requests (``GET /healthz`` and the authenticated ``GET /v1/models``),
sequentially, three ways:

* alone;
* while one client posts hostile records back to back (one record in verification at any time:
  the issue's "while a hostile verification record is processed");
* while ``--posters`` clients post hostile records (every cap hit, plus legal checks sized to
  spend the whole per-record budget) to ``POST /v1/experiences`` without pause, as shipped;
* the same, with verification in a thread of the replica (``verify_workers: 0``, the pool's
  fallback): off the loop but sharing its GIL;
* the same, with verification run on the event loop (the ablation: what moving it off buys).

The worker process is started (and the first record verified) before timing, so its one-off
spawn is not charged to the probes.

Prints a table with the p50 / p95 of each and their ratio to "alone", and writes it to ``--out``
(Markdown + JSON).

    python -m loadtests.verify_bench --probes 300 --posters 4
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

from loadtests._report import bench_parser, write_report

__all__ = ["hostile_record", "main"]

# NOTE: each hits one cap of the calculator or the operand checks (see serve.experience._verify).
_HOSTILE = ["round(5, -10**7)", "10**10**10", "9**9**9", "(10**300)**1000", "factorial(10**6)",
            "(" * 240 + "1" + ")" * 240, "-" * 300 + "1", "9" * 400, "x ** x ** x = 1"]
# NOTE: a legal expression near the 200-node cap: 32 of them are what spends a record's budget.
_HEAVY = " + ".join(["d * 2 - d / 4"] * 12)


def hostile_record() -> dict[str, Any]:
    """A record of 32 checks: every cap, then legal checks heavy enough to spend the budget."""
    checks: list[dict[str, Any]] = [{"type": "recomputation", "target": t[:1000], "expected": "1",
                                     "input": {"x": 9}} for t in _HOSTILE]
    checks += [{"type": "recomputation", "target": _HEAVY, "expected": "1"}] * (32 - len(checks))
    return {
        "metadata": {"source_model": "bench", "task_domain": "units", "topic": "bench/hostile"},
        "context": {"raw_text": "hostile verification", "quantities": [{"name": "d", "value": 120, "unit": "km"}]},
        "reasoning": [{"step_id": 1, "text": "compute"}],
        "verification": checks,
        "outcome": {"answer": "1"},
    }


def _app(data_dir: Path, mode: str) -> Any:
    from recallserve.deployments.engines import RemoteConfig, build_engine
    from recallserve.memory_shards import HashingEmbedder
    from recallserve.serve.api.app import create_app
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.experience import ExperienceConfig, ExperienceService, build_router, verify_record
    from recallserve.serve.pipeline import ChatPipeline

    class OnLoop(ExperienceService):
        """The ablation: verification on the event loop, as before issue 14 (caps still on)."""

        async def _verify(self, record: Any, required: Any) -> Any:
            return verify_record(record, self.rules, required=required)

    # NOTE: never called: the routes timed here do not reach the engine (nothing listens on port 9).
    engine = build_engine(RemoteConfig(base_url="http://127.0.0.1:9/v1", model="bench"))
    emb = HashingEmbedder(384)
    config = ExperienceConfig(data_dir=data_dir, verify_workers=1 if mode == "process" else 0)
    service = (OnLoop if mode == "loop" else ExperienceService)(config, emb.embed)
    auth = Authenticator({"sk-bench": "bench"})
    return create_app(ChatPipeline(engine), auth, routers=[build_router(service, auth)]), service


async def _measure(app: Any, probes: int, posters: int) -> dict[str, float]:
    import httpx

    headers = {"Authorization": "Bearer sk-bench"}
    record = hostile_record()
    posted: list[float] = []
    stop = asyncio.Event()
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app=app), base_url="http://bench") as client:

        async def poster() -> None:
            while not stop.is_set():
                start = time.perf_counter()
                r = await client.post("/v1/experiences", json=record, headers=headers)
                if r.status_code >= 500:
                    raise RuntimeError(f"hostile record answered {r.status_code}: {r.text[:200]}")
                posted.append(time.perf_counter() - start)

        if posters:  # NOTE: warm-up: starts the verification worker outside the timed window
            await client.post("/v1/experiences", json=record, headers=headers)
        tasks = [asyncio.create_task(poster()) for _ in range(posters)]
        await asyncio.sleep(0.2 if posters else 0)  # NOTE: let the posters reach steady state
        latencies = []
        for i in range(probes):
            start = time.perf_counter()
            r = await client.get("/healthz" if i % 2 == 0 else "/v1/models", headers=headers)
            latencies.append(time.perf_counter() - start)
            if r.status_code != 200:
                raise RuntimeError(f"ordinary request answered {r.status_code}")
            await asyncio.sleep(0.005)  # NOTE: a client's think time, so posters get the loop too
        stop.set()
        await asyncio.gather(*tasks)
    q = statistics.quantiles(latencies, n=20)
    out = {"posters": posters, "p50_ms": 1e3 * statistics.median(latencies), "p95_ms": 1e3 * q[18],
           "hostile_posts": len(posted)}
    if posted:
        out["hostile_post_p50_ms"] = 1e3 * statistics.median(posted)
    return out


def _run(probes: int, posters: int) -> dict[str, dict[str, float]]:
    results = {}
    for name, mode, n in [("alone", "process", 0), ("one hostile record at a time, worker process", "process", 1),
                          ("hostile posts, worker process", "process", posters),
                          ("hostile posts, worker thread", "thread", posters),
                          ("hostile posts, on the loop (ablation)", "loop", posters)]:
        with tempfile.TemporaryDirectory(prefix="rs-verify-bench-") as tmp:
            app, service = _app(Path(tmp), mode)
            try:
                results[name] = asyncio.run(_measure(app, probes, n))
            finally:
                service.close()
    return results


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("verify_bench", __doc__ or "", "verify-bench")
    p.add_argument("--probes", type=int, default=300, help="ordinary requests per measurement (default 300)")
    p.add_argument("--posters", type=int, default=4, help="concurrent clients posting hostile records (default 4)")
    args = p.parse_args(argv)
    if args.probes < 20 or args.posters < 1:
        p.error("--probes must be >= 20 and --posters >= 1")
    results = _run(args.probes, args.posters)
    base = results["alone"]
    lines = [f"# Ordinary requests while hostile verification records are posted "
             f"({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})", "",
             f"{args.probes} sequential GET /healthz and /v1/models; clients (`posters`) posting a 32-check "
             "hostile record without pause; one in-process app (one event loop, as one ingress replica).", "",
             "| run | posters | p50 | p95 | p50 / alone | hostile posts | hostile post p50 |",
             "|---|---:|---:|---:|---:|---:|---:|"]
    for name, r in results.items():
        post = f"{r['hostile_post_p50_ms']:.1f} ms" if "hostile_post_p50_ms" in r else "-"
        lines.append(f"| {name} | {r['posters']:.0f} | {r['p50_ms']:.2f} ms | {r['p95_ms']:.2f} ms "
                     f"| {r['p50_ms'] / base['p50_ms']:.2f}x "
                     f"| {r['hostile_posts']:.0f} | {post} |")
    write_report(args.out, "\n".join(lines) + "\n", {"probes": args.probes, "posters": args.posters, **results})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
