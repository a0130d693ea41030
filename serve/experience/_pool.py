"""Verification in worker processes, so a hostile record never competes for the ingress's GIL.

A worker thread (:func:`asyncio.to_thread`) keeps verification off the event loop but not off
the interpreter: the calculator is pure Python, so while it runs the loop gets the GIL only in
switch intervals and the p50 of every other request of the replica rises (issue 14: 1.4 ms alone,
2.5-3.3 ms under hostile posts). Here each check runs in a separate process instead:

* ``size`` workers, started lazily with the ``spawn`` context (a fork of a Ray worker or of a
  process holding threads is not safe), each owned by one thread of a small executor: the thread
  sends the record, waits on the pipe (no GIL held) and reads the result;
* a bounded queue: past ``queue`` records waiting, a record's checks fail unrun with the reason;
* tenants share it fairly: a tenant may hold at most half the places (``size + queue``, at least
  ``size``), so another tenant always finds a place, and a free worker takes the next record of the
  tenants that wait in turn (round robin; first come within one tenant), so one tenant's flood of
  hostile records neither fails another tenant's checks unrun nor makes them wait behind it (a
  first-come queue did both: its records were filed for review instead of as active);
* a per-call timeout: a worker that does not answer in time (a step the calculator's caps do not
  interrupt) is killed and replaced on its next call; the record's checks fail with the reason;
* if a worker cannot start, verification falls back to a thread in this process, said once in
  a log line: slower for the neighbours, never wrong.

Results are those of :func:`recallserve.serve.experience._verify.verify_record` (it runs in the worker with the
same arguments); only a timeout, a dead worker or a full queue produce the failed record of
:func:`failed_record`.

Example:
    >>> pool = VerifyPool(size=1, queue=64, timeout_s=2.0)  # doctest: +SKIP
    >>> verified = await pool.verify(record, rules, required=(), max_steps=20_000, seconds=0.25)  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import logging
import multiprocessing
import threading
import time
from collections import OrderedDict, deque
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from multiprocessing.connection import Connection
from typing import Any

from recallserve.serve.experience._rules import RuleTable
from recallserve.serve.experience._schema import ExperienceRecord
from recallserve.serve.experience._verify import finish_record, verify_record

__all__ = ["VerifyPool", "failed_record"]

log = logging.getLogger(__name__)

# NOTE: a spawned worker imports serve.experience (pydantic, numpy): seconds on a busy host, so
# its start is timed separately from the per-call timeout and generously.
_START_TIMEOUT_S = 60.0
_READY = "ready"


def failed_record(record: ExperienceRecord, note: str, required: Sequence[str] = ()) -> ExperienceRecord:
    """``record`` with every check failed unrun with ``note``, and the confidence that implies (low)."""
    checked = [v.model_copy(update={"actual": None, "status": "fail", "notes": note, "verified": False})
               for v in record.verification]
    return finish_record(record, checked, required)


def _settle(fut: asyncio.Future[Any], result: Any, exc: BaseException | None) -> None:
    """Set ``fut`` (on its loop) unless its waiter went away."""
    if fut.done():
        return
    if exc is not None:
        fut.set_exception(exc)
    else:
        fut.set_result(result)


def _worker_main(conn: Connection) -> None:
    """A worker's loop: one ``(record, rules, required, max_steps, seconds)`` in, one record out.

    NOTE: the parent closing its end (it exited, or was killed) ends ``recv`` with EOFError, so
    no worker outlives the replica that started it.
    """
    conn.send(_READY)
    while True:
        try:
            record, rules, required, max_steps, seconds = conn.recv()
        except (EOFError, OSError):
            return
        try:
            out: Any = verify_record(record, rules, required=required, max_steps=max_steps, seconds=seconds)
        except Exception as exc:  # noqa: BLE001 - reported to the parent as the check's reason
            out = f"cannot execute: verification error: {type(exc).__name__}: {exc}"
        conn.send(out)


class _Worker:
    """One spawned process and the parent's end of its pipe."""

    def __init__(self) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.proc = ctx.Process(target=_worker_main, args=(child,), daemon=True, name="recallserve-verify")
        self.proc.start()
        child.close()
        if not self.conn.poll(_START_TIMEOUT_S) or self.conn.recv() != _READY:
            self.kill()
            raise RuntimeError(f"verification worker did not start within {_START_TIMEOUT_S:.0f} s")

    def kill(self) -> None:
        """End the process now (SIGKILL: a stuck step ignores nothing less) and reap it."""
        self.proc.kill()
        self.proc.join(5)
        self.conn.close()


_Job = tuple[Callable[[], "ExperienceRecord | None"], "asyncio.Future[ExperienceRecord | None]", asyncio.AbstractEventLoop]


class VerifyPool:
    """``size`` verification processes behind a bounded queue shared fairly by tenants, with a per-call timeout.

    Args:
        size: Worker processes (each served by one executor thread).
        queue: Records allowed to wait for a worker; past it a record's checks fail unrun.
        timeout_s: Seconds a worker may take for one record before it is killed and replaced.
    """

    def __init__(self, size: int, queue: int, timeout_s: float) -> None:
        self.size, self.queue, self.timeout_s = size, queue, timeout_s
        self.per_tenant = max(size, (size + queue) // 2)
        self._executor = ThreadPoolExecutor(max_workers=size, thread_name_prefix="verify-pool")
        self._local = threading.local()
        self._workers: list[_Worker] = []
        self._lock = threading.Lock()
        self._pending = 0
        self._by_tenant: dict[str, int] = {}
        # NOTE: tenant -> its records waiting, oldest first; the dict's order is the round robin.
        self._jobs: OrderedDict[str, deque[_Job]] = OrderedDict()
        self._fallback = False
        self.recycled = 0

    @property
    def fallback(self) -> bool:
        """True once a worker could not start: verification runs in a thread of this process."""
        return self._fallback

    def pending_for(self, tenant: str) -> int:
        """Records of ``tenant`` running or waiting now."""
        with self._lock:
            return self._by_tenant.get(tenant, 0)

    async def verify(self, record: ExperienceRecord, rules: RuleTable, *, required: Sequence[str],
                     max_steps: int, seconds: float, tenant: str = "") -> ExperienceRecord:
        """:func:`verify_record` in a worker process (or, after a failed start, in a thread), in ``tenant``'s turn."""
        if self._fallback:
            return await asyncio.to_thread(verify_record, record, rules, required=required, max_steps=max_steps,
                                           seconds=seconds)
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[ExperienceRecord | None] = loop.create_future()
        job: _Job = (lambda: self._call(record, rules, tuple(required), max_steps, seconds), fut, loop)
        with self._lock:
            if self._pending >= self.size + self.queue:
                return failed_record(record, f"not run: verification queue full ({self.queue} records waiting)",
                                     required)
            if self._by_tenant.get(tenant, 0) >= self.per_tenant:
                return failed_record(record, f"not run: this tenant already has {self.per_tenant} records running or "
                                     "waiting for verification", required)
            self._pending += 1
            self._by_tenant[tenant] = self._by_tenant.get(tenant, 0) + 1
            self._jobs.setdefault(tenant, deque()).append(job)
        # NOTE: each submit runs one record, the next in turn (_run_next), not necessarily this one.
        self._executor.submit(self._run_next)
        out = await fut
        if out is None:  # the worker could not start: said once, then every call uses the thread
            return await self.verify(record, rules, required=required, max_steps=max_steps, seconds=seconds,
                                     tenant=tenant)
        return out

    def _run_next(self) -> None:
        """In an executor thread: run the oldest record of the next waiting tenant, then count it done."""
        with self._lock:
            if not self._jobs:  # NOTE: close() took the records that were waiting
                return
            tenant, jobs = next(iter(self._jobs.items()))
            run, fut, loop = jobs.popleft()
            if jobs:
                self._jobs.move_to_end(tenant)
            else:
                del self._jobs[tenant]
        out: ExperienceRecord | None = None
        error: BaseException | None = None
        try:
            out = run()
        except BaseException as exc:  # noqa: BLE001 - handed to the waiting coroutine
            error = exc
        finally:
            # NOTE: the place is given back before the caller hears the result: a caller that
            # verifies again at once must find it free (it was refused as "queue full" meanwhile).
            with self._lock:
                self._pending -= 1
                left = self._by_tenant[tenant] - 1
                if left:
                    self._by_tenant[tenant] = left
                else:
                    del self._by_tenant[tenant]
            loop.call_soon_threadsafe(_settle, fut, out, error)

    def _call(self, record: ExperienceRecord, rules: RuleTable, required: tuple[str, ...], max_steps: int,
              seconds: float) -> ExperienceRecord | None:
        """Runs in this thread's own worker; kills and forgets it on a timeout or a broken pipe."""
        worker: _Worker | None = getattr(self._local, "worker", None)
        if worker is None:
            try:
                worker = self._local.worker = _Worker()
            except Exception as exc:  # noqa: BLE001 - any start failure means: use the thread
                if not self._fallback:
                    log.warning("verification worker process could not start (%s: %s); verifying in a thread of "
                                "the ingress instead", type(exc).__name__, exc)
                self._fallback = True
                return None
            with self._lock:
                self._workers.append(worker)
        start = time.monotonic()
        try:
            worker.conn.send((record, rules, required, max_steps, seconds))
            if worker.conn.poll(self.timeout_s):
                out = worker.conn.recv()
                return out if isinstance(out, ExperienceRecord) else failed_record(record, str(out), required)
            note = (f"cannot execute: verification timed out after {1e3 * (time.monotonic() - start):.0f} ms "
                    "(worker process restarted)")
        except (EOFError, OSError) as exc:
            note = f"cannot execute: verification worker exited ({type(exc).__name__}, code {worker.proc.exitcode})"
        log.warning("verification worker %s recycled: %s", worker.proc.pid, note)
        self._retire(worker)
        return failed_record(record, note, required)

    def _retire(self, worker: _Worker) -> None:
        worker.kill()
        self._local.worker = None
        with self._lock:
            self._workers.remove(worker)
            self.recycled += 1

    def close(self) -> None:
        """Kill every worker and stop the executor (idempotent)."""
        with self._lock:
            workers, self._workers = self._workers, []
            jobs = [job for queue in self._jobs.values() for job in queue]
            self._jobs.clear()
        for w in workers:
            w.kill()
        self._executor.shutdown(wait=False, cancel_futures=True)
        for _, fut, loop in jobs:  # NOTE: their turns were cancelled with the executor: no waiter hangs
            if not loop.is_closed():
                loop.call_soon_threadsafe(_settle, fut, None, RuntimeError("verification pool closed"))
