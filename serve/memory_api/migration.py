"""Two memory generations behind one memory service: the write path of a zero-downtime re-embed.

While a new generation (new embedder, new shard folders) is built beside the serving one,
:class:`MigratingMemoryService` keeps both current::

    write (add / write-back / delete):  current generation first, then the target generation;
                                        acknowledged only when both hold it ("both"), or
                                        the target alone ("target", the last step)
    read  (search / get / list):        the generation named by ``reads`` ("current" | "target")

The order is what makes the live fill job (``recallserve.deployments.jobs._reembed_live``) safe without
tombstones or a write pause. The job copies each record ``r`` of the current generation into the
target with :meth:`~memory_shards.MemoryShard.insert_absent` (skipped when the target holds the
id or the same tenant's source id), then checks that the current generation still holds ``r``
and otherwise deletes its copy again by compare-and-set. Because a user's change reaches the
current generation *before* the target:

* an update the job raced with is either already in the target (the copy is skipped) or lands
  after the copy (and replaces it);
* a delete the job raced with has removed ``r`` from the current generation before it could
  reach the target, so the job's check after its insert sees ``r`` gone and removes the copy.

A write that fails half-way (current done, target failed) is answered with the target's error
(a 5xx, not acknowledged); the fill job's compare pass then brings the target to the current
generation's state. Last-access renewals of searches stay in the generation that answered; the
fill job carries the current generation's renewals made before it ran over (renewals between the
fill and the switch of reads are not, which only shifts time decay slightly).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal

from recallserve.memory_shards.coordinator import MemoryCoordinator
from recallserve.memory_shards.records import MemoryRecord
from recallserve.serve.api.errors import APIError
from recallserve.serve.api.metrics import MEMORY_MIGRATION_WRITES
from recallserve.serve.memory_api.service import MemoryService

__all__ = ["MigratingMemoryService"]


class MigratingMemoryService(MemoryService):
    """A :class:`MemoryService` that writes to two generations and reads from one.

    Args:
        current: the serving generation's service (its embedder and shards).
        target: the new generation's service (its own embedder and shards).
        target_name: the new generation's name (metrics label).
        reads: which generation answers reads.
        writes: ``"both"`` (current first, then target) or ``"target"`` alone (needs
            ``reads="target"``): the old generation is then idle and can be removed.

    Example:
        >>> svc = MigratingMemoryService(current_service, target_service, reads="current")
        >>> ids = await svc.add("acme", [MemoryIn(text="fan noise after firmware 2.1")])  # in both
    """

    def __init__(self, current: MemoryService, target: MemoryService, reads: Literal["current", "target"] = "current",
                 writes: Literal["both", "target"] = "both", target_name: str = "target") -> None:
        if reads not in ("current", "target"):
            raise ValueError(f"reads: expected 'current' or 'target', got {reads!r}")
        if writes not in ("both", "target") or (writes == "target" and reads != "target"):
            raise ValueError(f"writes: expected 'both', or 'target' with reads='target'; got {writes!r} with reads={reads!r}")
        side = current if reads == "current" else target
        super().__init__(side.coordinator, side.embed, top_k=side.top_k, threshold=side.threshold,
                         retrieval=side.retriever.params, rewriter=side.retriever.rewriter, max_batch=side.max_batch)
        self.current = current
        self.target = target
        self.reads = reads
        self.writes = writes
        self._ok = MEMORY_MIGRATION_WRITES.labels(target_name, "ok")
        self._failed = MEMORY_MIGRATION_WRITES.labels(target_name, "failed")

    def coordinators(self) -> list[MemoryCoordinator]:
        """Both generations: the serving one and the migration's target."""
        return [*self.current.coordinators(), *self.target.coordinators()]

    async def _to_target(self, call):  # type: ignore[no-untyped-def]
        """Run one write on the target generation, counted as ok / failed."""
        try:
            out = await call
        except Exception:
            self._failed.inc()
            raise
        self._ok.inc()
        return out

    async def add_records(self, records: Sequence[MemoryRecord]) -> list[str]:
        """Embed and store ``records`` in the current generation, then in the target (same ids)."""
        if self.writes == "target":
            return await self._to_target(self.target.add_records(records))
        ids = await self.current.add_records(records)
        await self._to_target(self.target.add_records(records))
        return ids

    async def delete(self, tenant: str, memory_id: str) -> None:
        """Delete from the current generation (its 404 / 403 answer the request), then from the target.

        The target may not hold the record yet (the fill job has not reached it), so its
        "not found" is expected and ignored; the fill job's check removes a copy it races with.
        """
        if self.writes == "target":
            await self.target.delete(tenant, memory_id)
            return
        await self.current.delete(tenant, memory_id)
        try:
            await self.target.delete(tenant, memory_id)
        except APIError as exc:
            if exc.status != 404:
                self._failed.inc()
                raise
        self._ok.inc()
