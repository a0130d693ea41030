"""Admission of API searches on one ingress replica: a few run, a few wait briefly, the rest get a fast 503.

Without a bound, every search a client sends is accepted and queues somewhere downstream (the
Ray router in front of the embedder and the shards, the shards' threads): on 2 cores, 64
closed-loop clients saw p50 5 s at a lower throughput than 4 clients (issue 15), so a client
learnt it was overloaded only after seconds. With :class:`SearchAdmission`:

* at most ``max_in_flight`` searches run at once (the embedder batches them, the shards gather
  them, so a handful in flight keeps the tier busy);
* up to ``max_waiting`` more wait for a slot, each at most ``max_wait_s``;
* a search beyond that, or one whose wait ran out, is refused with :class:`AdmissionRefused`,
  which the memory API answers as a 503 with ``Retry-After: retry_after_s`` at once.

Worst-case time a refused client spends: ~0 (queue full) or ``max_wait_s`` (waited, no slot);
an admitted one waits at most ``max_wait_s`` before its own search starts. The counts are per
ingress replica (each has its own event loop); ``max_in_flight`` 0 turns the bound off.

Tenants: the bound is shared, so it must not let one tenant's flood shut the others out (a
first-come queue did: a tenant with 200 searches open held every waiting place, and every other
tenant's search was refused). The waiters queue per tenant, and

* a freed slot goes to the tenants that wait in turn (round robin over tenants, first come within
  one), so a tenant with one search waiting is served next, however many another has waiting;
* when the waiting places are full, a newcomer whose tenant waits less than the tenant that waits
  most takes the place of that tenant's newest waiter, which is refused (503, as a full queue
  would have refused it); otherwise the newcomer is refused.

So a tenant never waits behind more than one search of each other tenant, and its searches are
refused only when it holds at least as many waiting places as any other tenant.

Chat turns (issue 37): the ingress admits ``POST /v1/chat/completions`` with the same class
(``chat.admission``, ``what="chat"``): ``max_in_flight`` = the turns the reasoner runs at once, the
others wait (up to ``max_waiting``) while they can still be served in time (``max_wait_s``, the
turn's admission deadline), and only then get the API's JSON 503 with ``Retry-After``. A key alone
holds every waiting place (nobody to push it out); beyond its fair share it loses places only to
tenants that wait less.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict, deque
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import Field

from recallserve.kernels import StrictModel

__all__ = ["AdmissionRefused", "SearchAdmission", "SearchAdmissionConfig"]


class SearchAdmissionConfig(StrictModel):
    """How many API searches one ingress replica runs at once, and how long others may wait."""

    max_in_flight: int = Field(
        default=0, ge=0, le=4096,
        description="API searches one ingress replica runs at once; 0 = no bound (every search is accepted and queues).",
    )
    max_waiting: int = Field(
        default=16, ge=0, le=100_000,
        description="Searches that may wait for a slot; one more is answered 503 at once.",
    )
    max_wait_s: float = Field(
        default=0.25, gt=0, le=600,
        description="Longest wait for a slot; a request still waiting then is answered 503 (for chats: the admission deadline).",
    )
    retry_after_s: float = Field(default=1.0, gt=0, le=300, description="Retry-After (seconds) of a refused search.")


class AdmissionRefused(RuntimeError):
    """A search was not admitted (too many waiting, or no slot within ``max_wait_s``).

    Attributes:
        retry_after_s: the retry hint for the client.
    """

    def __init__(self, reason: str, retry_after_s: float) -> None:
        super().__init__(reason)
        self.retry_after_s = retry_after_s


class SearchAdmission:
    """The bound of one replica (see the module docstring); use ``async with admission.slot(tenant): ...``.

    Args:
        config: the bound; ``max_in_flight`` 0 admits everything.
        what: what is admitted, named in a refusal's message ("memory search", "chat").

    Example:
        >>> admission = SearchAdmission(SearchAdmissionConfig(max_in_flight=8))
        >>> async with admission.slot("acme"):
        ...     hits = await retriever.search(...)  # doctest: +SKIP
    """

    def __init__(self, config: SearchAdmissionConfig, what: str = "memory search") -> None:
        self.config = config
        self.what = what
        self.running = 0
        self.refused = 0
        # NOTE: tenant -> its waiters, oldest first; the dict's order is the round robin (a tenant served
        # goes to the end while it still waits).
        self._queues: OrderedDict[str, deque[asyncio.Future[None]]] = OrderedDict()

    @property
    def waiting(self) -> int:
        """Searches waiting for a slot now, all tenants."""
        return sum(len(q) for q in self._queues.values())

    def waiting_for(self, tenant: str) -> int:
        """Searches of ``tenant`` waiting for a slot now."""
        q = self._queues.get(tenant)
        return len(q) if q is not None else 0

    @asynccontextmanager
    async def slot(self, tenant: str = "") -> AsyncIterator[None]:
        """Hold one of the ``max_in_flight`` slots for the block.

        Raises:
            AdmissionRefused: the waiting places are full and ``tenant`` waits at least as much as any
                other tenant, no slot came in ``max_wait_s``, or another tenant took this search's place.
        """
        if not self.config.max_in_flight:
            yield
            return
        await self._acquire(tenant)
        try:
            yield
        finally:
            self._release()

    def _refuse(self, reason: str) -> AdmissionRefused:
        self.refused += 1
        return AdmissionRefused(f"{self.what} overloaded: {reason}", self.config.retry_after_s)

    async def _acquire(self, tenant: str) -> None:
        c = self.config
        if self.running < c.max_in_flight and not self._queues:
            self.running += 1
            return
        if self.waiting >= c.max_waiting and not self._push_out_for(tenant):
            raise self._refuse(f"{self.running} running and {self.waiting} waiting")
        loop = asyncio.get_running_loop()
        fut: asyncio.Future[None] = loop.create_future()
        self._queues.setdefault(tenant, deque()).append(fut)
        try:
            # NOTE: wait_for returns the result when the slot was granted as the wait ran out.
            await asyncio.wait_for(fut, c.max_wait_s)
        except TimeoutError:
            self._forget(tenant, fut)
            raise self._refuse(f"no free slot within {c.max_wait_s:g} s") from None
        except asyncio.CancelledError:
            self._forget(tenant, fut)
            if fut.done() and not fut.cancelled() and fut.exception() is None:
                self._release()  # NOTE: granted, then the caller went away: the slot goes on
            raise

    def _push_out_for(self, tenant: str) -> bool:
        """Free a waiting place for ``tenant`` by refusing the newest waiter of the tenant that waits
        most, when that tenant waits more than ``tenant`` does; False when none does."""
        if not self._queues:
            return False
        most = max(self._queues, key=lambda t: len(self._queues[t]))
        if most == tenant or len(self._queues[most]) <= self.waiting_for(tenant):
            return False
        victim = self._queues[most].pop()
        if not self._queues[most]:
            del self._queues[most]
        if not victim.done():  # NOTE: a done one is already leaving (its wait ran out or was cancelled)
            victim.set_exception(self._refuse(f"another tenant's {self.what} took its waiting place"))
        return True

    def _forget(self, tenant: str, fut: asyncio.Future[None]) -> None:
        q = self._queues.get(tenant)
        if q is not None and fut in q:
            q.remove(fut)
            if not q:
                del self._queues[tenant]

    def _release(self) -> None:
        """Give a slot back: to the next waiting tenant in turn (its oldest waiter), or free it."""
        while self._queues:
            tenant, q = next(iter(self._queues.items()))
            fut = q.popleft()
            if q:
                self._queues.move_to_end(tenant)
            else:
                del self._queues[tenant]
            if not fut.done():
                fut.set_result(None)  # NOTE: the slot passes on; ``running`` stays the same
                return
        self.running -= 1
