"""Gather concurrent searches of one shard into one kernel launch (adaptive batching, no timer).

Each search call of a shard runs in its own thread (the Ray deployment's ``asyncio.to_thread``,
or any threaded caller). Without gathering, 64 concurrent one-query searches make 64 scans of
every row, one after the other under the shard's lock. With it:

* a call that finds no batch running runs at once (no added latency when idle);
* calls that arrive while a batch runs wait in a queue; when the batch ends, the first waiting
  call leads the next batch and runs every queued query (up to ``max_queries``) in one scan, so
  a busy shard reads its vectors once per batch instead of once per query.

Queries are grouped by what the kernel must share (``ScoreParams``, filters, exact/IVF) and by
their clock: one launch has one ``now``, so the calls of a group whose ``now`` readings lie within
``now_tolerance_s`` of each other run at the latest of them (a call that gave none runs at the
batch's own ``time.time()``); a call's answer is then the one it would get had it run that much
later, which it did (it waited in the queue). Each group is one ``run`` call with the largest
``k`` of the group, and each caller gets the first ``k`` of its own rows: the first ``k`` of a
top-``K`` list are the top-``k`` (same order and dedup).
"""

from __future__ import annotations

import asyncio
import threading
import time
from collections import deque
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import numpy as np

__all__ = ["CallGatherer", "SearchGatherer"]

T = TypeVar("T")
R = TypeVar("R")

#: run(queries [Q, D], tenants [Q], k, group, now) -> one hit list per query.
Runner = Callable[[np.ndarray, list[str], int, Any, float], list[list[Any]]]


@dataclass
class _Request:
    queries: np.ndarray
    tenants: list[str]
    k: int
    key: Hashable
    group: Any
    now: float | None
    done: threading.Event = field(default_factory=threading.Event)
    lead: bool = False
    result: list[list[Any]] | None = None
    error: BaseException | None = None


class SearchGatherer:
    """Runs concurrent searches together (see the module docstring).

    Args:
        run: the search of one group of stacked queries (holds the shard's lock itself).
        max_queries: most queries in one batch (bounds the ``[Q, k]`` work of one launch).
        now_tolerance_s: calls whose ``now`` differ by at most this share a launch (0: equal only).

    Example:
        >>> g = SearchGatherer(lambda q, t, k, grp, now: [[] for _ in t], max_queries=256)
        >>> g.submit(np.zeros((1, 4), np.float32), ["t1"], 5, key=("p",), group=None, now=None)
        [[]]
    """

    def __init__(self, run: Runner, max_queries: int = 256, now_tolerance_s: float = 1.0) -> None:
        if max_queries < 1:
            raise ValueError(f"max_queries: must be >= 1, got {max_queries}")
        self._run = run
        self.max_queries = max_queries
        self.now_tolerance_s = now_tolerance_s
        self._lock = threading.Lock()
        self._pending: list[_Request] = []
        self._running = False
        #: batches run and queries answered (for stats and tests).
        self.batches = 0
        self.queries = 0

    def submit(self, queries: np.ndarray, tenants: Sequence[str], k: int, key: Hashable, group: Any,
               now: float | None) -> list[list[Any]]:
        """Search ``queries`` (one tenant each) with everything in ``group`` at ``now`` (None: the
        batch's clock); blocks until answered. ``key`` identifies ``group`` (equal keys may share a scan).
        """
        req = _Request(queries, list(tenants), k, key, group, now)
        with self._lock:
            self._pending.append(req)
            if not self._running:
                self._running = True
                req.lead = True
        if not req.lead:
            req.done.wait()
        while req.lead:
            req.lead = False
            self._lead_one_batch()
        if req.error is not None:
            raise req.error
        assert req.result is not None
        return req.result

    def _lead_one_batch(self) -> None:
        with self._lock:
            batch, count = [], 0
            while self._pending and (not batch or count + len(self._pending[0].tenants) <= self.max_queries):
                r = self._pending.pop(0)
                batch.append(r)
                count += len(r.tenants)
        try:
            self._execute(batch)
        finally:
            with self._lock:
                self.batches += 1
                self.queries += count
                if self._pending:
                    # NOTE: hand the next batch to a waiting caller; this one returns its own answer now.
                    nxt = self._pending[0]
                    nxt.lead = True
                    nxt.done.set()
                else:
                    self._running = False
            for r in batch:
                r.done.set()

    def _execute(self, batch: list[_Request]) -> None:
        clock = time.time()
        groups: dict[Hashable, list[_Request]] = {}
        for r in batch:
            groups.setdefault(r.key, []).append(r)
        runs: list[tuple[float, list[_Request]]] = []
        for reqs in groups.values():
            # NOTE: split each key group into runs of `now` readings at most now_tolerance_s apart.
            reqs = sorted(reqs, key=lambda r: clock if r.now is None else r.now)
            start = 0
            for i in range(1, len(reqs) + 1):
                first = clock if reqs[start].now is None else reqs[start].now
                if i == len(reqs) or (clock if reqs[i].now is None else reqs[i].now) - first > self.now_tolerance_s:
                    part = reqs[start:i]
                    runs.append((max(clock if r.now is None else r.now for r in part), part))
                    start = i
        for now, reqs in runs:
            try:
                q = np.concatenate([r.queries for r in reqs]) if len(reqs) > 1 else reqs[0].queries
                tenants = [t for r in reqs for t in r.tenants]
                hits = self._run(q, tenants, max(r.k for r in reqs), reqs[0].group, now)
                at = 0
                for r in reqs:
                    r.result = [h[: r.k] for h in hits[at : at + len(r.tenants)]]
                    at += len(r.tenants)
            except BaseException as exc:  # noqa: BLE001 - handed to every caller of the group
                for r in reqs:
                    r.error = exc


class CallGatherer(Generic[T, R]):
    """The same gathering for coroutine callers on one event loop (the embedder's forward pass).

    ``submit(item)`` answers ``run([item, ...])[i]``. A call that finds nothing running starts a
    batch at once (after ``first_wait_s``, 0 = none); the calls that arrive while a batch runs
    wait, and when it ends the next batch takes all of them (up to ``max_items``). So with a forward
    of F seconds and calls arriving at rate r, a batch holds about ``max(1, r * F)`` calls.

    Why not Ray Serve's ``@serve.batch``: its loop takes a batch off the queue as soon as one call is
    there and only then waits for the running batch to end, so calls that arrive one by one during a
    forward each become a batch of one (measured: mean 1.05 with 16 staggered callers and a 100 ms
    forward, ``max_concurrent_batches=1``, wait 0). Here the batch is formed when the forward is free.

    Args:
        run: answers a list of items in order (one result per item); it is awaited, one batch at a time.
        max_items: most items in one batch (bounds one forward's memory and time).
        first_wait_s: how long a batch started from idle waits for company (0: none).

    Example:
        >>> async def double(xs): return [2 * x for x in xs]
        >>> asyncio.run(CallGatherer(double, max_items=8).submit(21))
        42
    """

    def __init__(self, run: Callable[[list[T]], Awaitable[list[R]]], max_items: int = 32,
                 first_wait_s: float = 0.0) -> None:
        if max_items < 1:
            raise ValueError(f"max_items: must be >= 1, got {max_items}")
        if first_wait_s < 0:
            raise ValueError(f"first_wait_s: must be >= 0, got {first_wait_s}")
        self._run = run
        self.max_items = max_items
        self.first_wait_s = first_wait_s
        self._pending: deque[tuple[T, asyncio.Future[R]]] = deque()
        self._drainer: asyncio.Task[None] | None = None
        #: batches run and items answered (mean batch = items / batches).
        self.batches = 0
        self.items = 0

    async def submit(self, item: T) -> R:
        """Answer ``item`` in the next batch (started now if none runs)."""
        fut: asyncio.Future[R] = asyncio.get_running_loop().create_future()
        self._pending.append((item, fut))
        if self._drainer is None:
            self._drainer = asyncio.create_task(self._drain())
        return await fut

    async def _drain(self) -> None:
        try:
            if self.first_wait_s > 0:
                await asyncio.sleep(self.first_wait_s)
            while self._pending:
                batch: list[tuple[T, asyncio.Future[R]]] = []
                while self._pending and len(batch) < self.max_items:
                    item, fut = self._pending.popleft()
                    if not fut.done():  # NOTE: a caller that went away (cancelled) is skipped
                        batch.append((item, fut))
                if not batch:
                    continue
                try:
                    results = await self._run([item for item, _ in batch])
                    if len(results) != len(batch):
                        raise RuntimeError(f"batch runner answered {len(results)} results for {len(batch)} items")
                except BaseException as exc:  # noqa: BLE001 - handed to every caller of the batch
                    cancelled = isinstance(exc, asyncio.CancelledError)
                    for _, fut in batch:
                        if not fut.done():
                            fut.cancel() if cancelled else fut.set_exception(exc)
                    if cancelled:
                        raise
                    continue
                for (_, fut), result in zip(batch, results):
                    if not fut.done():
                        fut.set_result(result)
                self.batches += 1
                self.items += len(batch)
        finally:
            # NOTE: no await between the empty check above and here, so no call can be left behind
            # unless the drainer itself was cancelled (loop shut down): those callers get an error.
            self._drainer = None
            while self._pending:
                _, fut = self._pending.popleft()
                if not fut.done():
                    fut.set_exception(RuntimeError("the batch gatherer stopped"))
