"""Concurrent searches of one shard share one scan and get the answers they would get alone."""

from __future__ import annotations

import asyncio
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import numpy as np
import pytest

from recallserve.memory_shards import MemoryShard, ScoreParams, ShardConfig
from recallserve.memory_shards._gather import CallGatherer, SearchGatherer

from .conftest import DIM, MODEL, NOW, make_items, unit


def _blocked_gatherer(n_waiting: int):
    """A gatherer whose first batch waits until ``n_waiting`` more calls are queued."""
    calls: list[tuple[int, int, float]] = []
    release = threading.Event()

    def run(q, tenants, k, group, now):
        calls.append((q.shape[0], k, now))
        if len(calls) == 1:
            assert release.wait(10)
        return [[(t, i) for i in range(k)] for t in tenants]

    g = SearchGatherer(run, max_queries=64)

    def watch() -> None:
        while len(g._pending) < n_waiting:
            time.sleep(0.001)
        release.set()

    return g, calls, watch


def test_calls_queued_behind_a_running_batch_share_one_run() -> None:
    g, calls, watch = _blocked_gatherer(n_waiting=10)
    q = np.zeros((1, 4), np.float32)
    with ThreadPoolExecutor(12) as pool:
        first = pool.submit(g.submit, q, ["t0"], 2, "p", None, 5.0)
        while not calls:
            time.sleep(0.001)
        rest = [pool.submit(g.submit, q, [f"t{i}"], 1 + i % 3, "p", None, 5.0) for i in range(1, 11)]
        watch()
        answers = [f.result(10) for f in [first, *rest]]
    assert calls == [(1, 2, 5.0), (10, 3, 5.0)]  # one run for the 10 queued calls, at their largest k
    for i, ans in enumerate(answers):
        assert ans == [[(f"t{i}", j) for j in range(2 if i == 0 else 1 + i % 3)]]
    assert (g.batches, g.queries) == (2, 11)


def test_groups_split_by_key_and_by_clock_and_errors_reach_their_callers() -> None:
    g, calls, watch = _blocked_gatherer(n_waiting=4)
    q = np.zeros((1, 4), np.float32)

    def boom(q, tenants, k, group, now):
        if group == "bad":
            raise ValueError("bad group")
        return g_run(q, tenants, k, group, now)

    g_run, g._run = g._run, boom
    with ThreadPoolExecutor(6) as pool:
        first = pool.submit(g.submit, q, ["a"], 1, "p", None, 100.0)
        while not calls:
            time.sleep(0.001)
        near = [pool.submit(g.submit, q, ["b"], 1, "p", None, t) for t in (100.2, 100.9)]
        far = pool.submit(g.submit, q, ["c"], 1, "p", None, 500.0)
        bad = pool.submit(g.submit, q, ["d"], 1, "bad", "bad", 100.0)
        watch()
        for f in [first, *near, far]:
            f.result(10)
        with pytest.raises(ValueError, match="bad group"):
            bad.result(10)
    # 100.2 and 100.9 share a run at the later clock; 500 runs alone.
    assert sorted(calls[1:]) == [(1, 1, 500.0), (2, 1, 100.9)]


def test_concurrent_shard_searches_equal_separate_ones(rng) -> None:
    items = make_items(rng, 2000, ["a", "b", "shared"])
    shard = MemoryShard(ShardConfig(model_id=MODEL, dim=DIM))
    alone = MemoryShard(ShardConfig(model_id=MODEL, dim=DIM, gather_max_queries=0))
    for s in (shard, alone):
        s.upsert(items)
    queries = unit(rng, 48)
    p = ScoreParams(threshold=0.2)
    jobs = [(queries[i], ("a", "b")[i % 2], 3 + i % 7) for i in range(48)]

    def ask(job):
        q, tenant, k = job
        return [h.record.id for h in shard.search(q, tenant, k=k, params=p, now=NOW, touch=False)[0]]

    with ThreadPoolExecutor(16) as pool:
        got = list(pool.map(ask, jobs))
    want = [[h.record.id for h in alone.search(q, t, k=k, params=p, now=NOW, touch=False)[0]] for q, t, k in jobs]
    assert got == want
    st = shard.stats()
    assert st["search_queries"] == 48 and 1 <= st["search_batches"] <= 48
    assert alone.stats()["search_batches"] == 0


def test_gather_bench_cli_writes_rows(tmp_path, capsys) -> None:
    import json

    from recallserve.deployments.cli import main

    out = tmp_path / "g.json"
    assert main(["bench", "gather", "--rows", "2k", "--dim", "16", "--clients", "1,4", "--seconds", "0.5",
                 "--out", str(out)]) == 0
    rows = json.loads(out.read_text())
    assert [(r["mode"], r["clients"]) for r in rows] == [("alone", 1), ("gathered", 1), ("alone", 4), ("gathered", 4)]
    assert all(r["answers"] > 0 and r["p95_ms"] >= r["p50_ms"] > 0 for r in rows)
    assert rows[0]["queries_per_scan"] == rows[2]["queries_per_scan"] == 1.0
    assert main(["bench", "gather", "--clients", "0"]) == 2
    assert "--clients" in capsys.readouterr().err


# --- CallGatherer: the embedder's coroutine callers ---------------------------------------------

def test_call_gatherer_batches_calls_that_arrive_during_a_forward() -> None:
    """Staggered callers (one every 5 ms, 40 ms forward) share forwards; each gets its own answer;
    an idle call runs alone at once."""
    sizes: list[int] = []

    async def forward(items: list[int]) -> list[int]:
        sizes.append(len(items))
        await asyncio.sleep(0.04)
        return [x * 10 for x in items]

    async def main() -> tuple[list[int], int]:
        g = CallGatherer(forward, max_items=6)
        alone = await g.submit(7)

        async def call(i: int) -> int:
            await asyncio.sleep(0.005 * i)
            return await g.submit(i)

        got = await asyncio.gather(*(call(i) for i in range(24)))
        assert g.items == 25 and g.batches == len(sizes)
        return list(got), alone

    got, alone = asyncio.run(main())
    assert alone == 70 and sizes[0] == 1
    assert got == [i * 10 for i in range(24)]
    assert max(sizes) == 6  # capped at max_items
    assert len(sizes) - 1 <= 24 // 2  # gathered: far fewer forwards than calls (a batch of one each without)


def test_call_gatherer_error_reaches_its_batch_only_and_cancelled_callers_are_skipped() -> None:
    seen: list[list[int]] = []
    release = asyncio.Event()

    async def forward(items: list[int]) -> list[int]:
        seen.append(list(items))
        if -1 in items:
            await release.wait()  # NOTE: an event, not a sleep: the first batch is in flight until the cancel
            raise ValueError("bad item")
        return items

    async def main() -> None:
        g = CallGatherer(forward, max_items=8)
        first = asyncio.create_task(g.submit(-1))
        for _ in range(100):  # bounded: until the first batch is in flight
            if seen:
                break
            await asyncio.sleep(0.001)
        gone = asyncio.create_task(g.submit(99))
        kept = asyncio.create_task(g.submit(5))
        await asyncio.sleep(0)
        gone.cancel()
        release.set()
        with pytest.raises(ValueError, match="bad item"):
            await first
        assert await kept == 5
        with pytest.raises(asyncio.CancelledError):
            await gone

    asyncio.run(main())
    assert seen == [[-1], [5]]  # the cancelled caller's item never reached a forward


def test_call_gatherer_rejects_bad_sizes() -> None:
    async def forward(items: list[int]) -> list[int]:
        return items

    with pytest.raises(ValueError, match="max_items"):
        CallGatherer(forward, max_items=0)
    with pytest.raises(ValueError, match="first_wait_s"):
        CallGatherer(forward, first_wait_s=-1)
