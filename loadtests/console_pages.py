"""How fast each console page is usable with 10k memories and 100 sessions, in a real browser.

Three ways to reach an app, one seeding and one measurement:

* in process (default): the app of :mod:`loadtests._console_app` (a stand-in model that follows
  the agent protocol, the hashing embedder) served by uvicorn on 127.0.0.1;
* ``--start-cluster``: the ``cpu-local`` profile started as ``recallserve up`` starts it
  (:mod:`recallserve.deployments.runner`: embedded Ray, Serve proxy, the memory shards, the MiniLM embedder, the
  ``state`` deployment owning the session / trace / experience SQLite files), its folders under a
  scratch ``.recallserve/console-<time>``, on 127.0.0.1:``--port``, the chat roles on ``--model``
  (default the tiny SmolLM2: the run measures the console, not generation), stopped at the end;
* ``--url``: a cluster that is already running (loopback only), with ``--key`` / ``--empty-key``.

Seeding goes through the HTTP API only: ``--memories`` memories (``POST /v1/memories``, batches of
256), ``--sessions`` sessions of ``--turns`` chat turns each, so as many traced turns, plus
``--reviews`` experiences in the review queue. In process every turn goes through the agent (the
stand-in model answers at once); in a cluster each turn is a real model call with ``agent: off``
and ``max_tokens`` 8, and ``--start-cluster`` turns the agent off and recalls ``--recall-k``
memories per turn (a 1k-token agent prompt per turn costs tens of seconds on 2 shared cores; the
pages read the same stores either way).
Then headless Chromium signs in and, ``--repeats`` times per page, times from the click to the
page being usable (its data on screen):

* Memories: a search submitted -> the result rows shown;
* Sessions: the list shown, then a session opened (summary, entities, last context) shown;
* Turns: the list shown, then a turn's trace shown;
* Review queue: the queue shown;
* Health: the figure cards shown.

The baseline, measured in the same run, is the same page for a tenant with no data, so ``ratio``
is what the data volume costs. Target: every page usable in under 1 s.

    python -m loadtests.console_pages --memories 10000 --sessions 100
    flock /tmp/recallserve-ray.lock python -m loadtests.console_pages --start-cluster \
        --out loadtests/results/console-pages-cluster
"""

from __future__ import annotations

import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import Any

from recallserve.client import RecallServe, RecallServeError

from loadtests._console_app import CHROMIUM_ARGS, build_console_app, chromium_path, serve_in_thread
from loadtests._guard import HostRefused, check_host
from loadtests._report import bench_parser, write_report

__all__ = ["main"]

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
TOPICS = ["printers/jams", "printers/ink", "orders/delivery", "orders/returns", "billing/refunds"]


def _chat_body(model: str, s: int, turn: int, turns: int, agent: bool) -> dict[str, Any]:
    """Turn ``turn`` of session ``s``: through the agent (route, steps, tool calls) when ``agent``,
    else ``agent: off`` and 8 tokens (one short model call)."""
    text = (f"My order is 104208 and my unit is U-{s}." if turn == 0 else
            "Where is order 104208?" if turn == turns - 1 else f"Note {turn}: the printer on floor {s % 7} jams.")
    body: dict[str, Any] = {"model": model, "user": f"user{s % 10}", "messages": [{"role": "user", "content": text}],
                            "metadata": {"session_id": f"s-{s}"} | ({} if agent else {"agent": "off"})}
    return body if agent else body | {"max_tokens": 8}


def _review_record() -> dict[str, Any]:
    """An E-CoT record whose recomputation fails (120 km / 1.5 h is 80 km/h, not 95), so it waits for review."""
    return {
        "metadata": {"source_model": "qwen2.5-7b", "task_domain": "units", "topic": "physics/speed"},
        "context": {"raw_text": "A car drives 120 km in 1.5 h. What is its speed?",
                    "quantities": [{"name": "d", "value": 120, "unit": "km"}]},
        "reasoning": [{"step_id": 1, "text": "divide distance by time", "principle": "v = d / t"}],
        "verification": [{"type": "recomputation", "target": "d / 1.5"},
                         {"type": "unit_check", "target": "120 km / 1.5 h", "expected": "km/h"}],
        "outcome": {"answer": "95 km/h", "confidence": "high"},
    }


def _seed(url: str, key: str, model: str, *, memories: int, sessions: int, turns: int, reviews: int,
          agent: bool, clients: int, first_session: int = 0, seed_seconds: float | None = None) -> dict[str, Any]:
    """Write one tenant's data through the API; returns the seconds each part took and the counts.

    ``clients`` sessions are chatted at once (each session's turns in order); every answer must be
    200. Sessions are numbered from ``first_session``; none starts after ``seed_seconds`` (the
    report gives the counts the tenant holds).
    """
    took: dict[str, Any] = {}
    with RecallServe(url, key, timeout=600) as c:
        t = time.perf_counter()
        for start in range(0, memories, 256):
            c.memories.add([{"text": f"Note {i}: customer {i % 997} reported {TOPICS[i % 5].split('/')[1]} on unit U-{i}; "
                                     f"fixed by step {i % 13}.", "source_id": f"note:{i}", "topic": TOPICS[i % 5]}
                            for i in range(start, min(start + 256, memories))])
        took["memories_s"] = time.perf_counter() - t
        print(f"console_pages: {memories} memories written in {took['memories_s']:.0f} s", flush=True)

        def session(s: int) -> None:
            if seed_seconds is not None and time.perf_counter() - t > seed_seconds:
                return
            for turn in range(turns):
                body = _chat_body(model, s, turn, turns, agent)
                try:
                    c.chat(body.pop("messages"), **body)
                except RecallServeError as exc:
                    raise RuntimeError(f"session s-{s} turn {turn}: {exc}") from None
            if s % 10 == 9:
                print(f"console_pages: session s-{s} done at {time.perf_counter() - t:.0f} s", flush=True)

        t = time.perf_counter()
        with ThreadPoolExecutor(max_workers=max(1, clients)) as pool:
            list(pool.map(session, range(first_session, first_session + sessions)))
        took["sessions_s"] = time.perf_counter() - t
        for _ in range(reviews):
            c.experiences.create(_review_record())
        deadline = time.monotonic() + 120
        while True:  # NOTE: traces are written off the request path
            listed = c.turns.sessions(limit=500).data
            stored = sum(x.turns for x in listed)
            if stored >= sessions * turns or seed_seconds is not None:
                break
            if time.monotonic() > deadline:
                raise RuntimeError(f"{stored} of {sessions * turns} turn traces stored after 120 s")
            time.sleep(0.5)
        # NOTE: /v1/console/health is an operator console route (no API model): the client's own httpx client.
        took["stored"] = {"memories": c.http.get("/v1/console/health").json()["memory_records"],
                          "sessions": len(listed), "turns": stored, "review": len(c.experiences.review(limit=500))}
    return took


Step = Callable[[], None]


def _pages(page: Any) -> dict[str, tuple[Step, Step]]:
    """Per page: (prepare: go to another page, untimed; act: the operator's action, returning once
    the page's data is on screen)."""

    def leave(to: str) -> Step:
        def run() -> None:
            page.click(f"#nav a[data-page={to}]")
            page.wait_for_selector(f'#page[data-page="{to}"] h2')
        return run

    def show(name: str, ready: str) -> Step:
        def run() -> None:
            page.click(f"#nav a[data-page={name}]")
            page.wait_for_selector(ready)
        return run

    def then_open(first: Step, list_sel: str, detail_sel: str) -> Step:
        def run() -> None:
            first()
            page.locator(f"{list_sel} tr.row").first.click()
            page.wait_for_selector(detail_sel)
        return run

    def prepare_search() -> None:
        leave("health")()
        leave("memories")()
        page.fill("#memory-search input[name=query]", "customer reported jams on unit fixed by step")

    def search() -> None:
        page.click("#memory-search button[type=submit]")
        page.wait_for_selector("#memory-results p.note")

    sessions = show("sessions", "#page[data-page=sessions] h2 ~ *")
    turns = show("turns", "#turn-list table, #turn-list p")
    return {
        "memories: search": (prepare_search, search),
        "sessions: list": (leave("memories"), sessions),
        "sessions: open one": (leave("memories"), then_open(sessions, "#page[data-page=sessions]", "#session-detail .detail")),
        "turns: list": (leave("memories"), turns),
        "turns: open a trace": (leave("memories"), then_open(turns, "#turn-list", "#turn-trace")),
        "review: queue": (leave("memories"), show("review", "#review-list p.note")),
        "health: figures": (leave("memories"), show("health", "#health-cards .card")),
    }


def _timed(prepare: Step, act: Step) -> float:
    prepare()
    start = time.perf_counter()
    act()
    return time.perf_counter() - start


def _measure(url: str, key: str, repeats: int, *, loaded: bool) -> dict[str, dict[str, float]]:
    from playwright.sync_api import sync_playwright

    out: dict[str, dict[str, float]] = {}
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=chromium_path(), args=CHROMIUM_ARGS)
        page = browser.new_page(viewport={"width": 1400, "height": 900})
        page.set_default_timeout(30_000)
        page.goto(url + "/console")
        page.fill("#api-key", key)
        page.click("#signin button[type=submit]")
        page.wait_for_selector("#memory-search")
        for name, (prepare, act) in _pages(page).items():
            if not loaded and (name.endswith("open one") or name.endswith("open a trace")):
                continue  # NOTE: nothing to open for the empty tenant
            _timed(prepare, act)  # NOTE: warm-up (first render, first SQLite pages)
            times = [_timed(prepare, act) for _ in range(repeats)]
            out[name] = {"median_s": statistics.median(times), "max_s": max(times)}
        browser.close()
    return out


@contextmanager
def _in_process() -> Iterator[tuple[str, dict[str, str]]]:
    """The console rig served on 127.0.0.1: (its URL, {"loaded": key, "empty": key})."""
    with tempfile.TemporaryDirectory(prefix="rs-console-bench-") as tmp:
        app, coord, _engine = build_console_app(Path(tmp), KEYS)
        try:
            with serve_in_thread(app) as url:
                yield url, {"loaded": "sk-acme", "empty": "sk-globex"}
        finally:
            for shard_client in coord.shards:
                shard_client.shard.close()


@contextmanager
def _cluster(profile: str, port: int, model: str, recall_k: int) -> Iterator[tuple[str, dict[str, str]]]:
    """``profile`` started as ``recallserve up`` starts it (scratch folders, ``model`` for the chat
    roles, the two bench keys, no agent, ``recall_k`` memories per turn), shut down on exit.

    NOTE: Ray's own SIGTERM handler aborts the driver (no ``finally``): stop a run with Ctrl-C.
    """
    from recallserve.deployments import runner
    from loadtests._cluster import scratch_config

    root = Path(__file__).resolve().parents[1]
    scratch = root / ".recallserve" / time.strftime("console-%Y%m%dT%H%M%S", time.gmtime())
    config = scratch_config(profile, port, scratch, model, auth={"keys": KEYS}, agent_enabled=False)
    config.memory.top_k = recall_k
    runner.prepare_models(config, progress=False)
    try:
        t = time.perf_counter()
        runner.start_ray(config)
        runner.deploy(config)
        print(f"console_pages: {profile} up on 127.0.0.1:{port} in {time.perf_counter() - t:.0f} s", flush=True)
        yield f"http://127.0.0.1:{port}", {"loaded": "sk-acme", "empty": "sk-globex"}
    finally:
        runner.shutdown()
        shutil.rmtree(scratch, ignore_errors=True)


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("console_pages", __doc__ or "", "console-pages")
    p.add_argument("--memories", type=int, default=10_000, help="the tenant's memories (default 10000)")
    p.add_argument("--sessions", type=int, default=100, help="the tenant's sessions (default 100)")
    p.add_argument("--turns", type=int, default=2, help="chat turns per session, each traced (default 2)")
    p.add_argument("--reviews", type=int, default=50, help="experiences in the review queue (default 50)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per page (default 5)")
    p.add_argument("--clients", type=int, default=4, help="sessions chatted at once while seeding (default 4)")
    p.add_argument("--first-session", type=int, default=0, help="number of the first seeded session (default 0)")
    p.add_argument("--seed-seconds", type=float, default=None,
                   help="start no session after this many seconds of session seeding (default: no limit)")
    where = p.add_mutually_exclusive_group()
    where.add_argument("--start-cluster", action="store_true",
                       help="start the profile's cluster (embedded Ray, scratch folders) and stop it at the end")
    where.add_argument("--url", default=None, help="a running cluster (loopback only)")
    p.add_argument("--key", default="sk-local", help="with --url: the key of the tenant to seed (default sk-local)")
    p.add_argument("--empty-key", default=None, help="with --url: a key of a tenant with no data (the baseline)")
    p.add_argument("--profile", default="cpu-local", help="with --start-cluster: the profile (default cpu-local)")
    p.add_argument("--model", default="smollm2-135m-instruct-q4_1",
                   help="with --start-cluster: the chat roles' model (default the tiny SmolLM2)")
    p.add_argument("--port", type=int, default=8019, help="with --start-cluster: HTTP port (default 8019)")
    p.add_argument("--recall-k", type=int, default=4, help="with --start-cluster: memories a turn recalls (default 4)")
    args = p.parse_args(argv)
    for name, lo, hi in [("memories", 0, 100_000), ("sessions", 1, 500), ("turns", 1, 10), ("reviews", 0, 500),
                         ("repeats", 1, 50), ("clients", 1, 32), ("port", 1024, 65535),
                         ("recall_k", 1, 64)]:
        if not lo <= getattr(args, name) <= hi:
            p.error(f"--{name}: must be within [{lo}, {hi}], got {getattr(args, name)}")
    if chromium_path() is None:
        p.error("Debian's chromium is not installed (apt-get install -y chromium)")
    if args.url is not None:
        if args.empty_key is None:
            p.error("--url needs --empty-key (a tenant with no data, the baseline)")
        try:
            base = check_host(args.url)
        except HostRefused as exc:
            p.error(f"--url: {exc}")
        target: Any = nullcontext((base, {"loaded": args.key, "empty": args.empty_key}))
        where_text, model = f"a running cluster at {args.url}", "recallserve"
    elif args.start_cluster:
        target = _cluster(args.profile, args.port, args.model, args.recall_k)
        where_text = (f"the {args.profile} cluster (embedded Ray, Serve proxy on 127.0.0.1, MiniLM embedder, "
                      f"sharded memory, state deployment; chat roles on {args.model}, agent off, "
                      f"{args.recall_k} memories recalled per turn)")
        model = "recallserve"
    else:
        target = _in_process()
        where_text, model = "app in process on 127.0.0.1 (uvicorn, one process, stand-in model)", "recallserve"
    in_cluster = args.url is not None or args.start_cluster
    with target as (url, keys):
        seeded = _seed(url, keys["loaded"], model, memories=args.memories, sessions=args.sessions, turns=args.turns,
                       reviews=args.reviews, agent=not in_cluster,
                       clients=args.clients if in_cluster else 1, first_session=args.first_session,
                       seed_seconds=args.seed_seconds)
        loaded = _measure(url, keys["loaded"], args.repeats, loaded=True)
        empty = _measure(url, keys["empty"], args.repeats, loaded=False)
    load = os.getloadavg()[0]
    stored = seeded["stored"]
    lines = [f"# Console pages: time to usable ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})", "",
             f"Headless Chromium against {where_text}. {stored['memories']} memory records (the tenant's), "
             f"{stored['sessions']} sessions ({stored['turns']} traced turns), {stored['review']} experiences in "
             f"review; baseline: the same page for a tenant with no data. {args.repeats} runs per page after a "
             f"warm-up. Seeding through the API took {seeded['memories_s']:.0f} s (memories) and "
             f"{seeded['sessions_s']:.0f} s (sessions). "
             f"Machine: {os.cpu_count()} CPUs, load average {load:.1f} at the end (other work shares them).", "",
             "| page | median | max | empty tenant (median) | ratio | under 1 s |", "|---|---:|---:|---:|---:|---|"]
    for name, r in loaded.items():
        base = empty.get(name, {}).get("median_s")
        vs = ("— | —" if base is None else f"{1e3 * base:.0f} ms | {r['median_s'] / base:.2f}x")
        lines.append(f"| {name} | {1e3 * r['median_s']:.0f} ms | {1e3 * r['max_s']:.0f} ms | {vs} | "
                     f"{'yes' if r['max_s'] < 1 else 'NO'} |")
    write_report(args.out, "\n".join(lines) + "\n", {"args": vars(args) | {"out": str(args.out)}, "load_average": load,
                                                       "seeded": seeded, "loaded": loaded, "empty": empty})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
