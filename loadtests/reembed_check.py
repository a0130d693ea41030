"""Re-embed check: switch the memory tier to a new embedder while HTTP clients keep using it.

Usage::

    python -m loadtests.reembed_check                      # 300 seed memories, 3 clients, tiny chat model
    python -m loadtests.reembed_check --seed 2000 --clients 4 --out bench-results/reembed

What it does (all on 127.0.0.1, in scratch folders):

1. starts the cluster (``recallserve.deployments.runner``) with the profile (default ``cpu-local``; chat roles
   on ``--model``, default the tiny SmolLM2, agent off: the check is about the memory tier) and
   writes ``--seed`` memories over HTTP;
2. starts ``--clients`` closed-loop clients that add, delete and search memories and ask short
   chats, each request timed;
3. rolls the app through the re-embed (each step is ``runner.redeploy``, the code behind
   ``recallserve deploy``): ``memory.migration`` to generation ``v2`` with MiniLM int8
   (``--model-to``) -> ``recallserve job reembed --live`` (in process) -> ``reads: target`` ->
   ``writes: target`` -> ``v2`` the only generation;
4. stops the clients and checks every memory they were told was stored (HTTP 200 on add and
   not deleted since) with ``GET /v1/memories/{id}``, every deleted one (404), and the stored
   model id of every record in the new shards;
5. writes ``report.json`` and ``report.md`` (per step: requests, errors, p50 / p95 / max
   latency per kind) into ``--out``.

Exit code 0 when no request failed, no acknowledged memory is missing, no deleted one came
back, and every record is in the new model's space.
NOTE: it starts Ray and loads models: a few minutes of CPU on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import random
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from loadtests._guard import check_host  # noqa: E402
from recallserve.client import AsyncRecallServe, ConnectionFailed, RecallServe, RecallServeError, RetryPolicy  # noqa: E402

__all__ = ["summarise", "render_markdown", "main"]

KINDS = ("add", "delete", "search", "chat")


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu-local", help="profile to start (default cpu-local)")
    p.add_argument("--model", default="smollm2-135m-instruct-q4_1", help="chat model of the three roles")
    p.add_argument("--model-to", default="all-MiniLM-L6-v2-int8", help="embedder of the new generation")
    p.add_argument("--seed", type=int, default=300, help="memories written before the clients start")
    p.add_argument("--clients", type=int, default=3, help="closed-loop HTTP clients during the roll-out")
    p.add_argument("--settle", type=float, default=10.0, help="seconds of load between steps")
    p.add_argument("--port", type=int, default=8013, help="HTTP port on 127.0.0.1 (not 8000: leave that to `up`)")
    p.add_argument("--out", type=Path, default=None, help="artifact folder (default bench-results/reembed-<time>)")
    return p.parse_args(argv)


def _configure(args: argparse.Namespace, scratch: Path):  # type: ignore[no-untyped-def]
    from loadtests._cluster import scratch_config

    # NOTE: agent off: the check is about the memory tier, and a plain chat is one model call.
    return scratch_config(args.profile, args.port, scratch, args.model, agent_enabled=False)


def _steps(config: Any, scratch: Path, model_to: str) -> list[tuple[str, Any]]:
    """(name, config) of each roll-out step after the start."""
    data = config.model_dump(mode="json")
    migration = {"generation": "v2", "data_dir": str(scratch / "memory-v2"), "embedder": {**data["embedder"], "model": model_to}}

    def with_memory(memory: dict[str, Any]) -> Any:
        return type(config).model_validate({**data, "memory": {**data["memory"], **memory}})

    return [
        ("migration (dual writes)", with_memory({"migration": migration})),
        ("reads: target", with_memory({"migration": {**migration, "reads": "target"}})),
        ("writes: target", with_memory({"migration": {**migration, "reads": "target", "writes": "target"}})),
        ("v2 only", with_memory({"generation": "v2", "data_dir": migration["data_dir"], "embedder": migration["embedder"],
                                 "migration": None})),
    ]


class Load:
    """Closed-loop HTTP clients; every request is recorded as (t, step, kind, status, seconds)."""

    def __init__(self, base: str, key: str, model: str, clients: int) -> None:
        self.base, self.key, self.model, self.clients = base, key, model, clients
        self.step = "start"
        self.records: list[tuple[float, str, str, int, float]] = []
        self.acked: set[str] = set()
        self.deleted: set[str] = set()
        self.stop = threading.Event()
        self._n = 0

    async def _one(self, rs: AsyncRecallServe, rng: random.Random) -> None:
        self._n += 1
        n = self._n
        roll = rng.random()
        kind = "add" if roll < 0.45 or not self.acked else "delete" if roll < 0.6 else "search" if roll < 0.9 else "chat"
        start = time.monotonic()
        status, rid = 200, None
        try:
            if kind == "add":
                rid = (await rs.memories.add([{"text": f"ticket {n}: unit {n % 17} shows error E{n % 9}; "
                                                       f"fixed by step {n % 5}"}])).ids[0]
            elif kind == "delete":
                rid = rng.choice(sorted(self.acked))
                self.acked.discard(rid)
                await rs.memories.delete(rid)
            elif kind == "search":
                await rs.memories.search(f"error E{n % 9} fix", k=5)
            else:
                await rs.chat([{"role": "user", "content": "Say OK."}], model=self.model, max_tokens=8)
        except ConnectionFailed as exc:  # NOTE: no answer is a failed request here
            status = -1
            print(f"reembed_check: {kind} failed: {exc}", flush=True)
        except RecallServeError as exc:
            status = exc.status
        seconds = time.monotonic() - start
        self.records.append((time.time(), self.step, kind, status, seconds))
        if kind == "add" and rid is not None:
            self.acked.add(rid)
        elif kind == "delete" and status == 200 and rid is not None:
            self.deleted.add(rid)

    async def run(self) -> None:
        async def client(i: int) -> None:
            rng = random.Random(i)
            # NOTE: retries off: every refusal during the roll-out is counted.
            async with AsyncRecallServe(self.base, self.key, timeout=300.0, retry=RetryPolicy(max_retries=0)) as rs:
                while not self.stop.is_set():
                    await self._one(rs, rng)

        await asyncio.gather(*(client(i) for i in range(self.clients)))


def summarise(records: list[tuple[float, str, str, int, float]]) -> list[dict[str, Any]]:
    """Per (step, kind): requests, errors (status != 200), p50 / p95 (nearest rank) / max seconds."""
    rows = []
    steps = list(dict.fromkeys(r[1] for r in records))
    for step in steps:
        for kind in KINDS:
            lat = sorted(r[4] for r in records if r[1] == step and r[2] == kind)
            if not lat:
                continue
            errors = sum(1 for r in records if r[1] == step and r[2] == kind and r[3] != 200)
            rows.append({"step": step, "kind": kind, "requests": len(lat), "errors": errors,
                         "p50_s": round(statistics.median(lat), 3), "p95_s": round(lat[math.ceil(0.95 * len(lat)) - 1], 3),
                         "max_s": round(lat[-1], 3)})
    return rows


def render_markdown(report: dict[str, Any]) -> str:
    """The report as a markdown page."""
    lines = [f"# Re-embed check ({report['meta']['started_utc']})", "",
             f"Embedder {report['meta']['from']} -> {report['meta']['to']}; {report['meta']['seed']} seed memories, "
             f"{report['meta']['clients']} clients; chat model {report['meta']['model']}.", "",
             "| step | took | note |", "|---|---:|---|"]
    for s in report["steps"]:
        lines.append(f"| {s['name']} | {s['seconds']:.1f} s | {s.get('note', '')} |")
    lines += ["", "| step | kind | requests | errors | p50 | p95 | max |", "|---|---|---:|---:|---:|---:|---:|"]
    for r in report["rows"]:
        lines.append(f"| {r['step']} | {r['kind']} | {r['requests']} | {r['errors']} | {r['p50_s']:.2f} s | "
                     f"{r['p95_s']:.2f} s | {r['max_s']:.2f} s |")
    c = report["checks"]
    lines += ["", f"Checks: {c['acked']} acknowledged memories, {c['missing']} missing; {c['deleted']} deleted, "
                  f"{c['resurrected']} back; {c['records_v2']} records in v2, {c['wrong_model']} of another model; "
                  f"{c['errors']} failed requests. **{'PASS' if report['ok'] else 'FAIL'}**", ""]
    return "\n".join(lines)


def _verify(base: str, key: str, load: Load, app: str, num_shards: int, model_id: str) -> dict[str, int]:
    from ray import serve

    missing = resurrected = 0

    def status(rs: RecallServe, rid: str) -> int:
        try:
            rs.memories.get(rid)
        except RecallServeError as exc:
            return exc.status
        return 200

    with RecallServe(base, key, timeout=60.0, retry=RetryPolicy(max_retries=0)) as rs:
        for rid in sorted(load.acked - load.deleted):
            missing += status(rs, rid) != 200
        for rid in sorted(load.deleted):
            resurrected += status(rs, rid) != 404
    records = wrong = 0
    for i in range(num_shards):
        shard = serve.get_deployment_handle(f"memory_shard_v2_{i}", app_name=app)
        after = None
        while page := shard.page.remote(after, 500).result(timeout_s=120):
            records += len(page)
            wrong += sum(1 for it in page if it.record.embedding_model != model_id)
            after = page[-1].record.id
    return {"acked": len(load.acked - load.deleted), "missing": missing, "deleted": len(load.deleted),
            "resurrected": resurrected, "records_v2": records, "wrong_model": wrong}


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    scratch = Path(tempfile.mkdtemp(prefix="rs-re-"))
    config = _configure(args, scratch)
    base = check_host(f"http://127.0.0.1:{args.port}")
    key = next(iter(config.auth.keys), None)
    if key is None:
        raise SystemExit("reembed_check: the profile has no auth.keys entry to call the API with")
    out = args.out or ROOT / "bench-results" / time.strftime("reembed-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)

    from recallserve.deployments import runner
    from recallserve.deployments.jobs._common import JobOptions, LiveOptions
    from recallserve.deployments.jobs._reembed_live import run_live
    from recallserve.memory_shards.embedders import embedder_identity

    steps_done: list[dict[str, Any]] = []
    load = Load(base, key, config.chat.model_name, args.clients)
    runner.prepare_models(config, progress=False)
    try:
        started = time.monotonic()
        runner.start_ray(config)
        runner.deploy(config)
        steps_done.append({"name": "start", "seconds": time.monotonic() - started})
        with RecallServe(base, key, timeout=300.0) as rs:
            for start in range(0, args.seed, 50):
                load.acked.update(rs.memories.add([
                    {"text": f"archived ticket {i}: model {i % 23} fan noise after firmware 2.{i % 7}"}
                    for i in range(start, min(start + 50, args.seed))]).ids)
        print(f"reembed_check: running; {args.seed} memories seeded; {args.clients} clients start", flush=True)
        thread = threading.Thread(target=lambda: asyncio.run(load.run()), daemon=True)
        thread.start()
        time.sleep(args.settle)
        steps = _steps(config, scratch, args.model_to)
        for i, (name, cfg) in enumerate(steps):
            load.step = name
            seconds = runner.redeploy(cfg)
            steps_done.append({"name": f"deploy {name}", "seconds": seconds})
            print(f"reembed_check: deployed '{name}' in {seconds:.1f} s", flush=True)
            if i == 0:
                load.step = "reembed --live"
                opts = JobOptions(data_dir=scratch / "memory", model_id="-", dim=1, progress=False)
                report = run_live(opts, cfg, LiveOptions(app=cfg.name, temp_dir=cfg.ray.temp_dir))
                stats = {k: v for k, v in report.stats.items() if v}
                steps_done.append({"name": "reembed --live", "seconds": report.seconds, "note": json.dumps(stats)})
                print(f"reembed_check: reembed --live in {report.seconds:.1f} s: {stats}", flush=True)
            time.sleep(args.settle)
        load.stop.set()
        thread.join(timeout=330)
        final = steps[-1][1]
        checks = _verify(base, key, load, final.name, final.memory.num_shards, embedder_identity(args.model_to)[0])
    finally:
        load.stop.set()
        runner.shutdown()
    rows = summarise(load.records)
    checks["errors"] = sum(r["errors"] for r in rows)
    ok = checks["errors"] == checks["missing"] == checks["resurrected"] == checks["wrong_model"] == 0
    report = {"meta": {"started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "profile": args.profile,
                       "from": config.embedder.model, "to": args.model_to, "seed": args.seed, "clients": args.clients,
                       "model": args.model},
              "steps": steps_done, "rows": rows, "checks": checks, "ok": ok}
    (out / "report.json").write_text(json.dumps(report, indent=2))
    (out / "report.md").write_text(render_markdown(report))
    print(render_markdown(report))
    print(f"reembed_check: wrote {out}/report.md and report.json")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
