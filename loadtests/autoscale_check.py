"""Autoscaling check: start the cluster with autoscaling on one deployment, load it, and record
the replica counts from ``serve.status()`` every second: scale-up under load, scale-down after.

Usage::

    python -m loadtests.autoscale_check                       # ingress 1..3, tiny model
    python -m loadtests.autoscale_check --deployment reasoner --max-replicas 2 --model qwen2.5-coder-0.5b-instruct-q4_k_m

What it does:
1. loads a profile (default ``cpu-local``) and sets ``autoscaling`` on the chosen deployment
   (default ``ingress``: min 1, max 3, target_ongoing_requests 1, short delays so the check takes
   minutes, not tens of minutes); the three model roles use ``--model`` (default the tiny SmolLM2
   so the check is about scaling, not generation speed);
2. starts an embedded Ray on 127.0.0.1 (``recallserve.deployments.runner``) and deploys the app;
3. idles ``--idle`` s, then runs ``--concurrency`` closed-loop clients (each always has one chat
   request in flight, so ongoing requests ~= concurrency) for ``--load`` s, then stops the load and
   waits up to ``--cooldown`` s for the deployment to return to its minimum;
4. writes ``timeline.json`` (every sample: time, phase, replicas per deployment, requests done)
   and ``timeline.txt`` (a small text chart) into ``--out``.

Exit code 0 when the deployment scaled above its minimum under load and back to it afterwards.
NOTE: it starts Ray and loads a model: a few minutes of CPU on a 2-core machine.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
if str(ROOT) not in sys.path:
    sys.path.append(str(ROOT))

from loadtests._guard import check_host  # noqa: E402
from recallserve.client import AsyncRecallServe, ConnectionFailed, RecallServeError, RetryPolicy  # noqa: E402

__all__ = ["Sample", "Timeline", "render_chart", "summarise", "main"]


@dataclass
class Sample:
    """One poll of ``serve.status()``."""

    t: float
    phase: str
    replicas: dict[str, int]
    done: int
    errors: int


@dataclass
class Timeline:
    """Every sample of a run plus what it was run with."""

    meta: dict[str, Any]
    samples: list[Sample] = field(default_factory=list)

    def to_json(self) -> dict[str, Any]:
        return {"meta": self.meta, "samples": [s.__dict__ for s in self.samples]}


def summarise(tl: Timeline, deployment: str, min_replicas: int) -> dict[str, Any]:
    """Peak replicas under load, when it was first reached, and whether it came back to the minimum.

    ``scaled_up``: some load-phase (or cooldown) sample has more than ``min_replicas`` running;
    ``scaled_down``: the last sample is back at ``min_replicas`` after the peak.
    """
    def at(s: Sample) -> int:
        return s.replicas.get(deployment, 0)

    load = [s for s in tl.samples if s.phase in ("load", "cooldown")]
    peak = max((at(s) for s in load), default=0)
    first_peak = next((s.t for s in load if at(s) == peak), None)
    load_start = next((s.t for s in tl.samples if s.phase == "load"), None)
    load_end = next((s.t for s in tl.samples if s.phase == "cooldown"), None)
    back = next((s.t for s in tl.samples if s.phase == "cooldown" and at(s) == min_replicas), None)
    final = at(tl.samples[-1]) if tl.samples else 0
    return {
        "deployment": deployment,
        "min_replicas": min_replicas,
        "peak_replicas": peak,
        "scaled_up": peak > min_replicas,
        "scaled_down": peak > min_replicas and final == min_replicas,
        "seconds_to_peak_after_load_start": None if first_peak is None or load_start is None else round(first_peak - load_start, 1),
        "seconds_to_min_after_load_end": None if back is None or load_end is None else round(back - load_end, 1),
        "requests_done": tl.samples[-1].done if tl.samples else 0,
        "request_errors": tl.samples[-1].errors if tl.samples else 0,
    }


def render_chart(tl: Timeline, deployment: str, every_s: float = 5.0) -> str:
    """A text chart: one line per ~``every_s`` seconds with the replica count as a bar."""
    lines = [f"replicas of {deployment!r} over time (one line per {every_s:.0f} s; # = one replica)", ""]
    next_t = -1e9
    for s in tl.samples:
        if s.t < next_t and s is not tl.samples[-1]:
            continue
        next_t = s.t + every_s
        n = s.replicas.get(deployment, 0)
        others = " ".join(f"{k}={v}" for k, v in sorted(s.replicas.items()) if k != deployment)
        lines.append(f"{s.t:6.0f}s {s.phase:<8} {'#' * n:<6} {n}   done={s.done:<5} err={s.errors:<3} {others}")
    return "\n".join(lines) + "\n"


def _replicas(app_name: str) -> dict[str, int]:
    from ray import serve

    app = serve.status().applications.get(app_name)
    if app is None:
        return {}
    return {name: int(d.replica_states.get("RUNNING", 0)) for name, d in app.deployments.items()}


async def _client(base: str, body: dict[str, Any], key: str, stop: asyncio.Event, counts: dict[str, int]) -> None:
    # NOTE: retries off: the check counts every failed answer, as the load a user would see.
    async with AsyncRecallServe(base, key, timeout=120.0, retry=RetryPolicy(max_retries=0)) as rs:
        while not stop.is_set():
            try:
                await rs.chat(body["messages"], **{k: v for k, v in body.items() if k != "messages"})
                counts["done"] += 1
            except ConnectionFailed:
                counts["errors"] += 1
                await asyncio.sleep(0.5)
            except RecallServeError:
                counts["errors"] += 1


async def _drive(args: argparse.Namespace, app_name: str, base: str, key: str, model: str) -> Timeline:
    tl = Timeline(meta={})
    counts = {"done": 0, "errors": 0}
    t0 = time.monotonic()
    phase = "idle"
    stop_load = asyncio.Event()
    body = {"model": model, "messages": [{"role": "user", "content": "Say hi."}], "max_tokens": args.max_tokens}
    clients: list[asyncio.Task[None]] = []

    async def sample() -> Sample:
        reps = await asyncio.to_thread(_replicas, app_name)
        s = Sample(round(time.monotonic() - t0, 1), phase, reps, counts["done"], counts["errors"])
        tl.samples.append(s)
        return s

    while time.monotonic() - t0 < args.idle:
        await sample()
        await asyncio.sleep(1.0)
    phase = "load"
    load_start = time.monotonic()
    clients = [asyncio.create_task(_client(base, body, key, stop_load, counts))
               for _ in range(args.concurrency)]
    while time.monotonic() - load_start < args.load:
        s = await sample()
        print(f"  t={s.t:5.0f}s load     {args.deployment}={s.replicas.get(args.deployment, 0)} done={s.done} err={s.errors}", flush=True)
        await asyncio.sleep(1.0)
    phase = "cooldown"
    stop_load.set()
    cool_start = time.monotonic()
    while time.monotonic() - cool_start < args.cooldown:
        s = await sample()
        if int(time.monotonic() - cool_start) % 5 == 0:
            print(f"  t={s.t:5.0f}s cooldown {args.deployment}={s.replicas.get(args.deployment, 0)}", flush=True)
        if s.replicas.get(args.deployment, 0) == args.min_replicas and time.monotonic() - cool_start > 5:
            # NOTE: keep sampling a few more seconds so the chart shows it staying down.
            for _ in range(5):
                await asyncio.sleep(1.0)
                await sample()
            break
        await asyncio.sleep(1.0)
    await asyncio.gather(*clients, return_exceptions=True)
    return tl


def _parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--profile", default="cpu-local", help="profile to start (must be a CPU profile)")
    p.add_argument("--deployment", default="ingress", help="deployment to autoscale: ingress, router, reasoner, summariser")
    p.add_argument("--min-replicas", type=int, default=1)
    p.add_argument("--max-replicas", type=int, default=3)
    p.add_argument("--target-ongoing", type=float, default=1.0, help="target_ongoing_requests")
    p.add_argument("--downscale-delay", type=float, default=10.0, help="downscale_delay_s (short so the check ends)")
    p.add_argument("--model", default="smollm2-135m-instruct-q4_1", help="model of the three roles")
    p.add_argument("--concurrency", type=int, default=6, help="closed-loop clients during the load phase")
    p.add_argument("--max-tokens", type=int, default=8)
    p.add_argument("--idle", type=float, default=10.0, help="seconds sampled before the load")
    p.add_argument("--load", type=float, default=75.0, help="seconds of load")
    p.add_argument("--cooldown", type=float, default=120.0, help="most seconds to wait for scale-down")
    p.add_argument("--port", type=int, default=8011, help="HTTP port on 127.0.0.1 (not 8000: leave that to `up`)")
    p.add_argument("--out", type=Path, default=None, help="artifact folder (default bench-results/autoscale-<time>)")
    return p.parse_args(argv)


def _configure(args: argparse.Namespace):  # type: ignore[no-untyped-def]
    import tempfile

    from recallserve.deployments.options import AutoscalingOptions
    from loadtests._cluster import scratch_config

    config = scratch_config(args.profile, args.port, Path(tempfile.mkdtemp(prefix="rs-as-")), args.model)
    auto = AutoscalingOptions(
        min_replicas=args.min_replicas, max_replicas=args.max_replicas, target_ongoing_requests=args.target_ongoing,
        # NOTE: short delays and windows so that a check fits in a few minutes; production keeps
        # the profile's values (30 s down-scale delay avoids flapping).
        upscale_delay_s=2.0, downscale_delay_s=args.downscale_delay, metrics_interval_s=1.0, look_back_period_s=5.0,
    )
    if args.deployment == "ingress":
        config.ingress.autoscaling = auto
    elif args.deployment in ("router", "reasoner", "summariser"):
        # NOTE: a shared role (cpu-local's router and summariser) scales with its host's deployment.
        getattr(config, config.role_deployment(args.deployment)).deployment.autoscaling = auto
    else:
        raise SystemExit(f"autoscale_check: --deployment must be ingress, router, reasoner or summariser, got {args.deployment!r}")
    return config


def main(argv: list[str] | None = None) -> int:
    args = _parse_args(argv)
    config = _configure(args)
    base = check_host(f"http://127.0.0.1:{args.port}")
    key = next(iter(config.auth.keys), None)
    if key is None:
        raise SystemExit("autoscale_check: the profile has no auth.keys entry to call the API with")
    out = args.out or ROOT / "bench-results" / time.strftime("autoscale-%Y%m%dT%H%M%SZ", time.gmtime())
    out.mkdir(parents=True, exist_ok=True)

    from recallserve.deployments import runner

    print(f"autoscale_check: {args.deployment} autoscaling {args.min_replicas}..{args.max_replicas}, "
          f"target_ongoing_requests {args.target_ongoing}; model {args.model}; starting Ray ...", flush=True)
    started = time.monotonic()
    runner.prepare_models(config, progress=False)
    try:
        runner.start_ray(config)
        runner.deploy(config)
        print(f"autoscale_check: app running after {time.monotonic() - started:.0f} s; idle {args.idle:.0f} s, "
              f"load {args.load:.0f} s with {args.concurrency} clients, cooldown <= {args.cooldown:.0f} s", flush=True)
        tl = asyncio.run(_drive(args, config.name, base, key, config.chat.model_name))
    finally:
        runner.shutdown()
    tl.meta = {
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "profile": args.profile,
        "deployment": args.deployment, "autoscaling": config.deployment_options()[args.deployment].autoscaling.model_dump(),
        "model": args.model, "concurrency": args.concurrency, "max_tokens": args.max_tokens,
        "idle_s": args.idle, "load_s": args.load, "cooldown_max_s": args.cooldown,
    }
    summary = summarise(tl, args.deployment, args.min_replicas)
    (out / "timeline.json").write_text(json.dumps({**tl.to_json(), "summary": summary}, indent=2))
    chart = render_chart(tl, args.deployment)
    (out / "timeline.txt").write_text(chart + "\n" + json.dumps(summary, indent=2) + "\n")
    print(chart)
    print(json.dumps(summary, indent=2))
    print(f"autoscale_check: artifacts in {out}")
    return 0 if summary["scaled_up"] and summary["scaled_down"] else 1


if __name__ == "__main__":
    sys.exit(main())
