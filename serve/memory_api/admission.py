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
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

from pydantic import Field

from kernels import StrictModel

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
        default=0.25, gt=0, le=60, description="Longest wait for a slot; a search still waiting then is answered 503.",
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
    """The bound of one replica (see the module docstring); use ``async with admission.slot(): ...``.

    Args:
        config: the bound; ``max_in_flight`` 0 admits everything.

    Example:
        >>> admission = SearchAdmission(SearchAdmissionConfig(max_in_flight=8))
        >>> async with admission.slot():
        ...     hits = await retriever.search(...)  # doctest: +SKIP
    """

    def __init__(self, config: SearchAdmissionConfig) -> None:
        self.config = config
        self._slots = asyncio.Semaphore(config.max_in_flight) if config.max_in_flight else None
        self.waiting = 0
        self.refused = 0

    @asynccontextmanager
    async def slot(self) -> AsyncIterator[None]:
        """Hold one of the ``max_in_flight`` slots for the block.

        Raises:
            AdmissionRefused: ``max_waiting`` searches already wait, or no slot came in ``max_wait_s``.
        """
        if self._slots is None:
            yield
            return
        await self._acquire(self._slots)
        try:
            yield
        finally:
            self._slots.release()

    async def _acquire(self, slots: asyncio.Semaphore) -> None:
        c = self.config
        if slots.locked() and self.waiting >= c.max_waiting:
            self.refused += 1
            raise AdmissionRefused(f"memory search overloaded: {c.max_in_flight} running and {self.waiting} waiting",
                                   c.retry_after_s)
        self.waiting += 1
        try:
            # NOTE: a wait cut by the timeout after the slot was granted gives it back (asyncio.Semaphore).
            await asyncio.wait_for(slots.acquire(), c.max_wait_s)
        except TimeoutError:
            self.refused += 1
            raise AdmissionRefused(f"memory search overloaded: no free slot within {c.max_wait_s:g} s",
                                   c.retry_after_s) from None
        finally:
            self.waiting -= 1
