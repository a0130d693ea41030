"""How fast each console page is usable with 10k memories and 100 sessions, in a real browser.

Seeds one tenant (``acme``) through the HTTP API of the in-process app
(:mod:`loadtests._console_app`, served by uvicorn on 127.0.0.1): ``--memories`` memories, and
``--sessions`` sessions of two agent turns each (so as many traces), plus ``--reviews``
experiences in the review queue. Then headless Chromium signs in and, ``--repeats`` times per
page, times from the click to the page being usable (its data on screen):

* Memories: a search submitted -> the result rows shown;
* Sessions: the list shown, then a session opened (summary, entities, last context) shown;
* Turns: the list shown, then a turn's trace shown;
* Review queue: the queue shown;
* Health: the figure cards shown.

The baseline, measured in the same run, is the same page for a tenant with no data (``globex``),
so ``ratio`` is what the data volume costs. Target: every page usable in under 1 s.

    python -m loadtests.console_pages --memories 10000 --sessions 100
"""

from __future__ import annotations

import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx

from loadtests._console_app import CHROMIUM_ARGS, build_console_app, chromium_path, serve_in_thread
from loadtests._report import bench_parser, write_report

__all__ = ["main"]

KEYS = {"sk-acme": "acme", "sk-globex": "globex"}
TOPICS = ["printers/jams", "printers/ink", "orders/delivery", "orders/returns", "billing/refunds"]


def _seed(url: str, memories: int, sessions: int, reviews: int) -> dict[str, float]:
    """Write acme's data through the API; returns the seconds each part took."""
    from tests.unit.experience._records import speed_record

    auth = {"Authorization": "Bearer sk-acme"}
    took: dict[str, float] = {}
    with httpx.Client(base_url=url, headers=auth, timeout=120) as c:
        t = time.perf_counter()
        for start in range(0, memories, 256):
            batch = [{"text": f"Note {i}: customer {i % 997} reported {TOPICS[i % 5].split('/')[1]} on unit U-{i}; "
                              f"fixed by step {i % 13}.", "source_id": f"note:{i}", "topic": TOPICS[i % 5]}
                     for i in range(start, min(start + 256, memories))]
            r = c.post("/v1/memories", json={"memories": batch})
            r.raise_for_status()
        took["memories_s"] = time.perf_counter() - t
        t = time.perf_counter()
        for s in range(sessions):
            for text in (f"My order is 104208 and my unit is U-{s}.", "Where is order 104208?"):
                r = c.post("/v1/chat/completions", json={"model": "recallserve", "user": f"user{s % 10}",
                                                         "metadata": {"session_id": f"s-{s}"},
                                                         "messages": [{"role": "user", "content": text}]})
                r.raise_for_status()
        took["sessions_s"] = time.perf_counter() - t
        for _ in range(reviews):
            c.post("/v1/experiences", json=speed_record(answer="95 km/h", model="qwen2.5-7b")).raise_for_status()
        deadline = time.monotonic() + 120
        while len(c.get("/v1/turns", params={"limit": 500}).json()["data"]) < 2 * sessions:  # traces: off the request path
            if time.monotonic() > deadline:
                raise RuntimeError("the turn traces were not all stored within 120 s")
            time.sleep(0.2)
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


def _measure(url: str, key: str, repeats: int) -> dict[str, dict[str, float]]:
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
            if name.endswith("open one") or name.endswith("open a trace"):
                if not key.endswith("acme"):
                    continue  # NOTE: nothing to open for the empty tenant
            _timed(prepare, act)  # NOTE: warm-up (first render, first SQLite pages)
            times = [_timed(prepare, act) for _ in range(repeats)]
            out[name] = {"median_s": statistics.median(times), "max_s": max(times)}
        browser.close()
    return out


def main(argv: list[str] | None = None) -> int:
    p = bench_parser("console_pages", __doc__ or "", "console-pages")
    p.add_argument("--memories", type=int, default=10_000, help="acme's memories (default 10000)")
    p.add_argument("--sessions", type=int, default=100, help="acme's sessions, two traced turns each (default 100)")
    p.add_argument("--reviews", type=int, default=50, help="experiences in acme's review queue (default 50)")
    p.add_argument("--repeats", type=int, default=5, help="timed runs per page (default 5)")
    args = p.parse_args(argv)
    if chromium_path() is None:
        p.error("Debian's chromium is not installed (apt-get install -y chromium)")
    with tempfile.TemporaryDirectory(prefix="rs-console-bench-") as tmp:
        app, coord, _engine = build_console_app(Path(tmp), KEYS)
        try:
            with serve_in_thread(app) as url:
                seeded = _seed(url, args.memories, args.sessions, args.reviews)
                loaded = _measure(url, "sk-acme", args.repeats)
                empty = _measure(url, "sk-globex", args.repeats)
        finally:
            for shard_client in coord.shards:
                shard_client.shard.close()
    load = os.getloadavg()[0]
    lines = [f"# Console pages: time to usable ({time.strftime('%Y-%m-%dT%H:%M:%SZ', time.gmtime())})", "",
             f"Headless Chromium, app on 127.0.0.1 (uvicorn, one process). Tenant with {args.memories} memories, "
             f"{args.sessions} sessions ({2 * args.sessions} traced turns), {args.reviews} experiences in review; "
             f"baseline: the same page for a tenant with no data. {args.repeats} runs per page after a warm-up. "
             f"Seeding took {seeded['memories_s']:.0f} s (memories) and {seeded['sessions_s']:.0f} s (sessions). "
             f"Machine: {os.cpu_count()} CPUs, load average {load:.1f} at the end (other work shares them).", "",
             "| page | median | max | empty tenant (median) | ratio | under 1 s |", "|---|---:|---:|---:|---:|---|"]
    for name, r in loaded.items():
        base = empty.get(name, {}).get("median_s")
        vs = ("— | —" if base is None else f"{1e3 * base:.0f} ms | {r['median_s'] / base:.2f}x")
        lines.append(f"| {name} | {1e3 * r['median_s']:.0f} ms | {1e3 * r['max_s']:.0f} ms | {vs} | "
                     f"{'yes' if r['max_s'] < 1 else 'NO'} |")
    write_report(args.out, "\n".join(lines) + "\n", {"args": vars(args) | {"out": str(args.out)}, "load_average": load,
                                                       "seeded_s": seeded,
                                                       "loaded": loaded, "empty": empty})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
