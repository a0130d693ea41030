"""Erase or export everything held for one end user of a tenant (or a whole tenant).

The inventory (:data:`HOLDERS`) is the one list of the places a user's text is kept; the erasure
and the export both walk it, so the two cannot drift apart:

==============  ==========================================================================
holder          what it holds for the user (and where)
==============  ==========================================================================
memories        memory records with ``user`` = the user key: API memories (every chunk and
                part, OCR text, image description), chat write-backs, agent image units,
                experience segments (memory shards: rows, WAL segments, snapshots, BM25)
sessions        sessions with their messages, rolling summary and entity table, and the
                user's carried constraints and facts (``sessions.sqlite3``)
experiences     segmented traces with ``metadata.user`` (``experiences.sqlite3``)
turns           turn traces: question, answer, recalled memories, rendered prompt (``turns.sqlite3``)
==============  ==========================================================================

An erasure is logged first (:class:`~._store.ErasureLog`, status ``pending``), then run in the
background: each SQLite store deletes and truncates its WAL, the memory shards delete and
rewrite their files (``MemoryShard.erase``); only when every holder answered does the log say
``done`` (and forget the user key). A run that fails (a shard down) stays ``failed`` and is
retried (``retry_s`` apart, at most ``max_attempts`` runs); :meth:`ErasureService.resume` runs
the unfinished ones after a restart. Each step is idempotent, so a kill -9 at any point and a
re-run leave nothing behind.

Audit: every erasure and export is a log row (tenant, user hash, requester key id, counts, times)
and one log line with the same fields; neither holds the user id or any content.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import logging
import uuid
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any, Protocol

from recallserve.memory_shards.records import MemoryRecord
from recallserve.serve.erasure._store import ErasureLog, ErasureRow

__all__ = ["ErasureService", "HOLDERS", "OwnedStore", "OwnedMemory", "user_hash"]

log = logging.getLogger("recallserve.erasure")

HOLDERS: tuple[str, ...] = ("sessions", "experiences", "turns", "memories")
"""Every holder of a user's text, in erasure order (the memory shards last: the experience
records' segments and the chat write-backs are memory records too)."""


class OwnedStore(Protocol):
    """A store that can erase and export by owner (session, experience and trace stores: SQLite
    here, Postgres through the same methods)."""

    async def erase_user(self, tenant: str, user: str | None) -> dict[str, Any]: ...

    async def export_user(self, tenant: str, user: str | None) -> dict[str, Any]: ...


class OwnedMemory(Protocol):
    """The memory coordinator's owner calls (``MemoryCoordinator.erase`` / ``owned``)."""

    async def erase(self, tenant: str, user: str | None) -> list[str]: ...

    async def owned(self, tenant: str, user: str | None) -> list[MemoryRecord]: ...


def user_hash(tenant: str, user: str | None) -> str:
    """What the audit keeps of a user: blake2b-128 of tenant and user key (``*`` = the whole tenant)."""
    body = f"{tenant}\x00{'*' if user is None else user}".encode()
    return hashlib.blake2b(body, digest_size=16, person=b"rs-erasure").hexdigest()


class ErasureService:
    """Erasures and exports over the holders of :data:`HOLDERS`.

    Args:
        erasures: the erasure / export log.
        memories: the coordinators of every memory generation (``MemoryService.coordinators()``;
            both during a live re-embed).
        stores: holder name -> store (``sessions``, ``experiences``, ``turns``; any may be missing).
        retry_s: wait before re-running a failed erasure.
        max_attempts: runs of one erasure per process before it waits for :meth:`resume`.
        caches: clear functions of this process's caches that may hold recalled rows (the turn's
            recall cache); called after every erasure run.
        settle_s: a second pass this long after the first (the longest chat turn: the pipeline's
            deadline plus its background write-back): a turn of the user that was in flight when
            the erasure started stores its session append, trace and write-back after the first
            pass; the erasure is ``done`` only after the second.
        lease_s: how long a run's claim on an erasure holds (:meth:`ErasureLog.claim`); renewed
            before each pass, so it must exceed one pass plus ``settle_s``. A replica that died
            mid-run is taken over by another one's :meth:`poll` after it.
    """

    def __init__(self, erasures: ErasureLog, memories: Sequence[OwnedMemory], stores: dict[str, OwnedStore], *,
                 caches: Sequence[Callable[[], None]] = (), retry_s: float = 5.0, max_attempts: int = 20,
                 settle_s: float = 0.0, lease_s: float = 120.0) -> None:
        unknown = sorted(set(stores) - set(HOLDERS))
        if unknown:
            raise ValueError(f"stores: unknown holders {unknown}; known: {', '.join(HOLDERS)}")
        self.erasures = erasures
        self.memories = list(memories)
        self.stores = dict(stores)
        self.caches = list(caches)
        if settle_s < 0:
            raise ValueError(f"settle_s: must be >= 0, got {settle_s}")
        self.settle_s = settle_s
        if lease_s <= settle_s:
            raise ValueError(f"lease_s: must exceed settle_s ({settle_s}), got {lease_s}")
        self.lease_s = lease_s
        #: This process's name in the log's leases (one per service instance).
        self.runner = "run_" + uuid.uuid4().hex[:16]
        self.retry_s = retry_s
        self.max_attempts = max_attempts
        self._tasks: dict[str, asyncio.Task[None]] = {}

    # ---- erasure --------------------------------------------------------------------------
    async def request(self, tenant: str, user: str | None, requester: str) -> ErasureRow:
        """Log an erasure of ``user`` (a stored user key; None: the whole tenant) and start it.

        Idempotent: while one is unfinished, the same row comes back (and runs if it is not running).
        """
        row, created = await self.erasures.begin(tenant, user, user_hash(tenant, user), requester)
        if created:
            log.info("erasure %s requested: tenant=%s user_hash=%s requester=%s", row.id, tenant, row.user_hash,
                     requester)
        self._start(row, user)
        return row

    async def resume(self) -> int:
        """Start every unfinished erasure no other runner holds a live lease on (after a restart, and
        periodically: :meth:`poll`); returns how many this process claimed."""
        started = 0
        for row, user in await self.erasures.unfinished():
            running = self._tasks.get(row.id)
            if running is not None and not running.done():
                continue
            if await self.erasures.claim(row.id, self.runner, self.lease_s, count=False):
                self._start(row, user)
                started += 1
        return started

    async def poll(self, every_s: float) -> None:
        """:meth:`resume` every ``every_s`` seconds, for ever (a background task of each ingress
        replica): an erasure whose runner died is taken over once its lease ran out. A failed
        poll (the database down) is logged and tried again at the next tick."""
        while True:
            await asyncio.sleep(every_s)
            try:
                started = await self.resume()
            except Exception as exc:  # noqa: BLE001 - the next tick retries; no content in the line
                log.warning("erasure poll failed (%s); next in %.0f s", type(exc).__name__, every_s)
                continue
            if started:
                log.info("took over %d unfinished erasures", started)

    def _start(self, row: ErasureRow, user: str | None) -> None:
        task = self._tasks.get(row.id)
        if task is not None and not task.done():
            return
        self._tasks[row.id] = asyncio.get_running_loop().create_task(self._run(row, user))

    async def wait(self, erasure_id: str) -> None:
        """Wait for this process's run of the erasure (tests, the CLI)."""
        task = self._tasks.get(erasure_id)
        if task is not None:
            await task

    async def _run(self, row: ErasureRow, user: str | None) -> None:
        for attempt in range(self.max_attempts):
            # NOTE: one runner at a time across replicas: a live lease of another one ends this task
            # (that runner finishes it); ours is renewed before each pass.
            if not await self.erasures.claim(row.id, self.runner, self.lease_s):
                return
            try:
                counts = await self.erase_now(row.tenant, user)
                if self.settle_s > 0:
                    await asyncio.sleep(self.settle_s)
                    if not await self.erasures.claim(row.id, self.runner, self.lease_s, count=False):
                        return
                    late = await self.erase_now(row.tenant, user)
                    counts = {k: counts.get(k, 0) + late.get(k, 0) for k in {*counts, *late}}
            except Exception as exc:  # noqa: BLE001 - logged without content and retried
                why = f"{type(exc).__name__}: {str(exc)[:200]}"
                await self.erasures.fail(row.id, why)
                log.warning("erasure %s run %d failed (%s); retrying in %.0f s", row.id, attempt + 1,
                            type(exc).__name__, self.retry_s)
                await asyncio.sleep(self.retry_s)
                continue
            await self.erasures.finish(row.id, counts)
            log.info("erasure %s done: tenant=%s user_hash=%s requester=%s counts=%s", row.id, row.tenant,
                     row.user_hash, row.requester, counts)
            return

    async def erase_now(self, tenant: str, user: str | None) -> dict[str, int]:
        """Remove every copy held for ``user`` (None: the tenant) from every holder; counts per kind."""
        counts: dict[str, int] = {}
        for name in HOLDERS:
            if name == "memories":
                if self.memories:
                    erased = [await m.erase(tenant, user) for m in self.memories]
                    counts["memories"] = len({i for ids in erased for i in ids})
                continue
            store = self.stores.get(name)
            if store is None:
                continue
            got = await store.erase_user(tenant, user)
            counts.update({k: int(v) for k, v in got.items() if isinstance(v, int)})
        for clear in self.caches:
            clear()
        return counts

    async def erased_since(self, tenant: str, user: str, since: float) -> bool:
        """Whether ``user`` (a stored user key) or the whole tenant was asked to be erased at or after
        ``since`` (epoch seconds; the chat pipeline's check before a turn stores what it produced:
        a turn still generating when the erasure began must not bring the user back after ``done``)."""
        return await self.erasures.erased_since(tenant, (user_hash(tenant, user), user_hash(tenant, None)), since)

    # ---- export ---------------------------------------------------------------------------
    async def export(self, tenant: str, user: str | None, requester: str) -> AsyncIterator[bytes]:
        """A JSON document of everything held for ``user``, produced holder by holder; the export
        is logged (with counts) once the last holder was read."""
        counts: dict[str, int] = {}
        yield b'{"object":"export","tenant":' + json.dumps(tenant).encode() + b',"user":' + \
            json.dumps(user).encode()
        for name in HOLDERS:
            if name == "memories":
                if not self.memories:
                    continue
                # NOTE: the serving generation's copy (a re-embed's target holds the same records).
                records = await self.memories[0].owned(tenant, user)
                counts["memories"] = len(records)
                yield b',"memories":['
                for i, rec in enumerate(records):
                    yield (b"," if i else b"") + rec.model_dump_json(exclude={"embedding_model"}).encode()
                yield b"]"
                continue
            store = self.stores.get(name)
            if store is None:
                continue
            part = await store.export_user(tenant, user)
            for key, value in part.items():
                counts[key] = len(value) if isinstance(value, list) else 0
                yield b',' + json.dumps(key).encode() + b":" + json.dumps(value).encode()
        yield b"}"
        row = await self.erasures.exported(tenant, user_hash(tenant, user), requester, counts)
        log.info("export %s: tenant=%s user_hash=%s requester=%s counts=%s", row.id, tenant, row.user_hash,
                 requester, counts)
