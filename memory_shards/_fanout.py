"""Shard calls with deadlines, and what the coordinator knows about each shard between calls.

A shard outage must stay confined to the data that lives on that shard. For that the
coordinator needs three things, kept here per shard:

* a deadline on every call (``ShardCallConfig``), so a hung shard becomes an answer;
* a *down* mark: set when a call fails or misses its deadline, cleared by a background probe
  (``stats()``; at most one in flight, at most one every ``retry_after_s``). While down, a
  request that needs the shard is answered :class:`ShardUnavailable` at once (a 503 with a retry
  hint above), and a request that does not need it does not wait for it;
* whether the shard holds shared records (``shared_rows``): learned from every hybrid search
  answer, probe and shared write. ``None`` (never heard) counts as "may hold", so a coordinator
  that knows nothing treats every shard as needed: never a silent partial answer.

What counts as a failure: :class:`ShardUnavailable` (what transport adapters such as the Ray
handle client raise), ``TimeoutError`` and ``OSError`` (a disk or socket failing). A
``ValueError`` / ``TypeError`` is the caller's bad input and passes through unchanged.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Awaitable, Callable, Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from .config import ShardCallConfig

__all__ = ["ShardCalls", "ShardUnavailable"]

log = logging.getLogger("recallserve.memory")

_OUTAGES = (TimeoutError, OSError)


class ShardUnavailable(RuntimeError):
    """A shard the answer needs is down or missed its deadline.

    Attributes:
        shard: index of the shard (the first one, when several are down).
        reason: why (``"timed out after 5.0 s"``, ``"ActorDiedError"`` ...).
        retry_after_s: when a retry may succeed (a probe will have checked the shard again).
    """

    def __init__(self, shard: int, reason: str, retry_after_s: float = 1.0) -> None:
        super().__init__(f"memory shard {shard} unavailable: {reason}")
        self.shard = shard
        self.reason = reason
        self.retry_after_s = retry_after_s

    def __reduce__(self):  # NOTE: keeps the fields when the error crosses a process (Ray, pickle).
        return (type(self), (self.shard, self.reason, self.retry_after_s))


@dataclass
class _State:
    down_reason: str | None = None
    shared_rows: int | None = None
    learned_at: float = float("-inf")
    last_probe: float = float("-inf")
    probe: asyncio.Task | None = None


class ShardCalls:
    """Timed calls to N shard clients, their down marks and their shared-record knowledge.

    Args:
        clients: one client per shard (``ShardClient``), shard 0 first.
        config: deadlines and the retry hint.
    """

    def __init__(self, clients: Sequence[Any], config: ShardCallConfig | None = None) -> None:
        self.clients = list(clients)
        self.config = config or ShardCallConfig()
        self._state = [_State() for _ in self.clients]

    # ---- knowledge ----------------------------------------------------------------------
    def is_down(self, shard: int) -> bool:
        """Whether the last call to ``shard`` failed and no probe has seen it back yet."""
        return self._state[shard].down_reason is not None

    def may_hold_shared(self, shard: int) -> bool:
        """False only when ``shard`` last reported no shared rows."""
        rows = self._state[shard].shared_rows
        return rows is None or rows > 0

    def learn_shared(self, shard: int, rows: int | None) -> None:
        """Record the shard's shared row count (None: the answer did not say)."""
        if rows is not None:
            st = self._state[shard]
            st.shared_rows = int(rows)
            st.learned_at = time.monotonic()

    def knows_no_shared(self, shard: int) -> bool:
        """Whether ``shard`` reported no shared rows within ``config.shared_refresh_s`` (never, when that is 0)."""
        st = self._state[shard]
        refresh = self.config.shared_refresh_s
        return refresh > 0 and st.shared_rows == 0 and time.monotonic() - st.learned_at < refresh

    def note_shared_write(self, shard: int) -> None:
        """A shared record was written to ``shard``: it holds shared rows from now on."""
        st = self._state[shard]
        st.shared_rows = max(st.shared_rows or 0, 1)

    def unavailable(self, shard: int) -> ShardUnavailable:
        """The error for a needed shard that is marked down (and a probe of it, if due)."""
        self._maybe_probe(shard)
        return ShardUnavailable(shard, self._state[shard].down_reason or "down", self.config.retry_after_s)

    # ---- calls --------------------------------------------------------------------------
    async def call(self, shard: int, method: str, *args: Any, write: bool = False) -> Any:
        """``clients[shard].method(*args)`` under its deadline.

        Raises:
            ShardUnavailable: the shard is marked down (at once), fails, or misses the deadline
                (then it is marked down).
        """
        if self.is_down(shard):
            raise self.unavailable(shard)
        return await self._timed(shard, getattr(self.clients[shard], method)(*args), write)

    async def gather(self, calls: dict[int, Callable[[], Awaitable[Any]]], needed: Iterable[int],
                     write: bool = False) -> dict[int, Any]:
        """Run ``calls`` (shard -> coroutine factory) concurrently; every needed shard must answer.

        A shard marked down is not called: a needed one fails the whole gather at once, another
        one is left out (and probed). A non-needed shard that fails is left out too.

        Returns:
            shard -> answer, for the shards that answered.

        Raises:
            ShardUnavailable: a needed shard is down, failed or timed out (the first such shard).
        """
        needed = set(needed)
        for s in sorted(needed):
            if self.is_down(s):
                raise self.unavailable(s)
        live = [s for s in calls if not self.is_down(s)]
        for s in calls:
            if s not in live:
                self._maybe_probe(s)
        answers = await asyncio.gather(*(self._timed(s, calls[s](), write) for s in live), return_exceptions=True)
        out: dict[int, Any] = {}
        first: BaseException | None = None
        for s, got in zip(live, answers):
            if not isinstance(got, BaseException):
                out[s] = got
            elif not isinstance(got, ShardUnavailable):
                first = first or got  # NOTE: bad input or a bug: the caller's error, not an outage.
            elif s in needed and not isinstance(first, ShardUnavailable):
                first = got
        if first is not None:
            raise first
        return out

    async def _timed(self, shard: int, awaitable: Awaitable[Any], write: bool) -> Any:
        timeout = self.config.write_timeout_s if write else self.config.read_timeout_s
        try:
            return await asyncio.wait_for(awaitable, timeout)
        except ShardUnavailable as exc:
            self._mark_down(shard, exc.reason)
            raise ShardUnavailable(shard, exc.reason, self.config.retry_after_s) from exc
        except TimeoutError as exc:
            reason = f"timed out after {timeout:g} s"
            self._mark_down(shard, reason)
            raise ShardUnavailable(shard, reason, self.config.retry_after_s) from exc
        except _OUTAGES as exc:
            reason = f"{type(exc).__name__}: {exc}"
            self._mark_down(shard, reason)
            raise ShardUnavailable(shard, reason, self.config.retry_after_s) from exc

    # ---- down marks and probes ----------------------------------------------------------
    def _mark_down(self, shard: int, reason: str) -> None:
        st = self._state[shard]
        if st.down_reason is None:
            log.warning("memory shard %d marked down: %s", shard, reason)
        st.down_reason = reason
        st.last_probe = time.monotonic()

    def _maybe_probe(self, shard: int) -> None:
        st = self._state[shard]
        if st.probe is not None or time.monotonic() - st.last_probe < self.config.retry_after_s:
            return
        st.last_probe = time.monotonic()
        st.probe = asyncio.get_running_loop().create_task(self._probe(shard))

    async def _probe(self, shard: int) -> None:
        st = self._state[shard]
        try:
            stats = await asyncio.wait_for(self.clients[shard].stats(), self.config.read_timeout_s)
        except Exception as exc:  # noqa: BLE001 - any failure keeps the shard down until the next probe
            st.down_reason = f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__
            st.last_probe = time.monotonic()
        else:
            self.learn_shared(shard, stats.get("shared_rows"))
            if st.down_reason is not None:
                log.warning("memory shard %d is back", shard)
            st.down_reason = None
        finally:
            st.probe = None

    async def drain(self) -> None:
        """Wait for running probes (tests, shutdown)."""
        probes = [st.probe for st in self._state if st.probe is not None]
        if probes:
            await asyncio.gather(*probes, return_exceptions=True)
