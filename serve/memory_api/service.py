"""The memory API's logic, and the chat pipeline's :class:`~recallserve.serve.memory.MemoryBackend`.

:class:`MemoryService` sits on a :class:`~memory_shards.MemoryCoordinator` whose shards are
hybrid (dense + BM25) and an async embedder: in-process (tests, ``recallserve eval locomo``) both
are local objects; on the cluster they are Ray Serve handles (``deployments/memory.py``). The
tenant is always an argument from the caller's API key; no request field can name another one.

Outages: a shard the answer needs that is down surfaces as :class:`MemoryUnavailable` (an
``APIError`` 503, type ``service_unavailable``, with ``retry_after_s``), which the router sends
with a ``Retry-After`` header and the chat recall reports in its metadata; a shard the answer
does not need is not waited for (see ``recallserve.memory_shards.coordinator``). An API search the replica
does not admit (``recallserve.serve.memory_api.admission``: too many running and waiting) is
:class:`MemoryOverloaded`, the same 503 with its own retry hint, answered at once.

Isolation rules (enforced by the shards, checked again here):
  * search, get and list see the tenant's own memories plus the shared collection;
  * delete removes only the tenant's own memories (a shared one is a 403, another tenant's a 404,
    the same answer as an id that never existed, so ids of other tenants leak nothing).

Personal data: every add applies the tenant's PII policy (``pii_for``) to every text, metadata
key and value, tag, topic and source id before anything is embedded or stored: ``mask`` (the
default) tags it, ``reject`` answers 400 naming the field, ``allow`` keeps it. The server's own
writes (:meth:`MemoryService.write`: chat and agent write-backs, experience segments) mask under
``reject`` instead of failing after the answer was sent.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager

import numpy as np
from pydantic import ValidationError

from recallserve.kernels import ScoreParams
from recallserve.memory_shards.chunking import DEFAULT_CHUNK_TOKENS, DEFAULT_OVERLAP_TOKENS, chunk_spans
from recallserve.memory_shards.config import SearchFilters
from recallserve.memory_shards.coordinator import MemoryCoordinator, ShardUnavailable
from recallserve.memory_shards.records import (
    MAX_TEXT_CHARS, SHARED_TENANT_NAME, EmbeddedRecord, MemoryRecord, clip_middle, new_record_id, private_record_id,
    shared_record_id,
)
from recallserve.memory_shards.retrieval import AsyncEmbed, HybridHit, HybridRetriever, QueryRewriter, RetrievalParams
from recallserve.serve.api.metrics import MEMORY_SEARCH
from recallserve.serve.api.errors import APIError, describe_error
from recallserve.serve.memory_api.admission import AdmissionRefused, SearchAdmission
from recallserve.serve.memory import MemoryHit, MemoryWrite, sources_first
from recallserve.serve.pii import MaskedValueError, PiiMode, apply_pii, apply_pii_id, for_write_back, mask_id, user_key
from recallserve.serve.memory_api.schemas import MAX_BATCH, MAX_K, FiltersIn, MemoryIn, MemoryOut, SearchRequest, SearchResult, to_epoch

__all__ = ["MemoryService", "MemoryUnavailable", "MemoryOverloaded", "record_out", "hit_out"]


class MemoryUnavailable(APIError):
    """A memory shard the answer needs is down or too slow: a 503 with a retry hint.

    Attributes:
        retry_after_s: seconds after which a retry may succeed (the ``Retry-After`` header).
        shard: index of the shard.
    """

    def __init__(self, exc: ShardUnavailable) -> None:
        super().__init__(503, f"{exc}; retry after {exc.retry_after_s:g} s", type="service_unavailable",
                         code="memory_unavailable")
        self.retry_after_s = exc.retry_after_s
        self.shard = exc.shard


class MemoryOverloaded(MemoryUnavailable):
    """An API search this replica did not admit (see ``recallserve.serve.memory_api.admission``): a 503 with a retry hint."""

    def __init__(self, exc: AdmissionRefused) -> None:
        APIError.__init__(self, 503, f"{exc}; retry after {exc.retry_after_s:g} s", type="service_unavailable",
                          code="memory_overloaded")
        self.retry_after_s = exc.retry_after_s
        self.shard = None


@contextmanager
def _shards_up() -> Iterator[None]:
    """Turn the memory tier's typed outage into the API's 503 (no partial answer, no 500)."""
    try:
        yield
    except ShardUnavailable as exc:
        raise MemoryUnavailable(exc) from exc


def record_out(rec: MemoryRecord) -> MemoryOut:
    """API view of a stored record."""
    return MemoryOut(**_record_fields(rec))


def _record_fields(rec: MemoryRecord) -> dict:
    return {
        "id": rec.id, "source_id": rec.source_id, "kind": rec.kind, "text": rec.text,
        "image_description": rec.image_description, "ocr_text": rec.ocr_text, "parts": rec.parts,
        "text_chunks": rec.text_chunks,
        "metadata": dict(rec.metadata), "topic": rec.topic_path, "user": rec.user, "shared": rec.is_shared,
        "created_at": rec.created_at, "last_access_at": rec.last_access_at, "expires_at": rec.expires_at,
    }


def hit_out(hit: HybridHit) -> SearchResult:
    """API view of a ranked hit with its score parts."""
    return SearchResult(
        **_record_fields(hit.record), score=hit.score, similarity=hit.similarity, time_factor=hit.time_factor, part_index=hit.part_index,
        dense_score=hit.dense_score, dense_rank=hit.dense_rank, lexical_score=hit.lexical_score,
        lexical_rank=hit.lexical_rank, ranker_score=hit.ranker_score,
    )


# NOTE: what the policy reads: every free text and label a memory stores; times, kinds and weights
# cannot hold personal data. The image hash is the client's string (no digest is checked), so it is
# read too: an e-mail sent as one was written to the WAL as sent.
# NOTE: MemoryRecord fields named differently in the request (MemoryIn).
_REQUEST_NAMES = {"topic_path": "topic"}
_PII_FIELDS = ("text", "source_id", "metadata", "topic", "image_description", "ocr_text", "image_hash", "parts",
               "error_tags")


def _scrubbed(item: MemoryIn, mode: PiiMode, param: str) -> MemoryIn:
    """``item`` with the PII policy applied to its text fields (the same object when nothing changed)."""
    if mode == "allow":
        return item
    fields = {name: getattr(item, name) for name in _PII_FIELDS}
    fields["parts"] = [p.model_dump() for p in item.parts]
    # NOTE: the source id is a dedup key: masked to a distinct key (serve.pii.mask_id), never to a
    # bare tag that two ids would share (the second write would replace the first).
    out = {name: apply_pii_id(value, mode, f"{param}.{name}") if name == "source_id" and value is not None
           else apply_pii(value, mode, f"{param}.{name}") for name, value in fields.items()}
    if out == fields:
        return item
    try:
        return MemoryIn.model_validate({**item.model_dump(), **out})
    except ValidationError as exc:
        # NOTE: a tag can be longer than the value it masks (a 32,000-character text of "pin:1"s).
        raise MaskedValueError.from_validation(exc.errors(), param) from None


def _filters(f: FiltersIn | None, mode: PiiMode) -> SearchFilters | None:
    """The store's filters of ``f``, compared as the tenant's writes were stored.

    NOTE: a write stores its metadata and topic masked (:func:`_scrubbed`), so a filter naming the
    values as the client sent them (``{"owner": "jane@example.com"}``) matched nothing: it is
    masked the same way first (a filter is not stored, so ``reject`` masks it too rather than fail).
    """
    if f is None:
        return None
    metadata, topic = f.metadata, f.topic_prefix
    if mode != "allow":
        metadata = None if metadata is None else apply_pii(metadata, "mask")
        topic = None if topic is None else apply_pii(topic, "mask")
    return SearchFilters(kinds=f.kinds, topic_prefix=topic, metadata=metadata,
                         created_after=to_epoch(f.created_after), created_before=to_epoch(f.created_before),
                         user=None if f.user is None else user_key(f.user, mode), with_unowned=f.include_tenant)


class MemoryService:
    """Add, search, get, delete and list memories of one tenant at a time.

    Args:
        coordinator: routes writes and reads; shards must answer ``hybrid_search``.
        embed: async embedder of the shards' model.
        top_k: default results per search (config ``memory.top_k``).
        threshold: default cosine threshold (config ``memory.threshold``).
        retrieval: fusion knobs.
        rewriter: optional query rewriting hook.
        max_batch: most memories per add.
        pii_for: tenant -> PII policy of its writes (``Authenticator.pii_for``); default: mask.
        chunk_tokens: a text longer than this many (estimated) tokens is embedded as chunks of at
            most this size, one row each, all of one record (None: one row per text).
        admission: bound on concurrent API searches (``caller="api"``; the chat recall and the
            warm-up are not refused); None admits every search.

    Example:
        >>> svc = MemoryService(coord, embed)
        >>> ids = await svc.add("acme", [MemoryIn(text="printer jams on tray 2")])
        >>> (await svc.search_request("acme", SearchRequest(query="paper jam")))[0].record.id == ids[0]
        True
    """

    def __init__(self, coordinator: MemoryCoordinator, embed: AsyncEmbed, *, top_k: int = 16, threshold: float = 0.35,
                 retrieval: RetrievalParams | None = None, rewriter: QueryRewriter | None = None,
                 max_batch: int = MAX_BATCH, pii_for: Callable[[str], PiiMode] | None = None,
                 chunk_tokens: int | None = DEFAULT_CHUNK_TOKENS, admission: SearchAdmission | None = None) -> None:
        if not 1 <= top_k <= MAX_K:
            raise ValueError(f"top_k: must be in 1..{MAX_K}, got {top_k}")
        if chunk_tokens is not None and not 16 <= chunk_tokens <= 1024:
            raise ValueError(f"chunk_tokens: must be in 16..1024 or None, got {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        self.coordinator = coordinator
        self.embed = embed
        self.top_k = top_k
        self.threshold = threshold
        self.max_batch = max_batch
        self.pii_for: Callable[[str], PiiMode] = pii_for or (lambda _tenant: "mask")
        self.retriever = HybridRetriever(coordinator, embed, retrieval, rewriter)
        self.admission = admission

    def coordinators(self) -> list[MemoryCoordinator]:
        """Every memory generation this service writes to (an erasure must reach each)."""
        return [self.coordinator]

    # ---- writes -------------------------------------------------------------------------
    async def add(self, tenant: str, items: Sequence[MemoryIn], *, pii: PiiMode | None = None) -> list[str]:
        """Store API memories for ``tenant``; durable on return; ids in order.

        ``pii``: the policy to apply (default: the tenant's).

        Raises:
            PersonalDataError: under ``reject``, naming the field (``memories.2.metadata.email``);
                :class:`~recallserve.serve.pii.MaskedValueError` under ``mask`` when a masked value outgrows its field.
        """
        mode = self.pii_for(tenant) if pii is None else pii
        now = time.time()
        records = []
        for i, item in enumerate(items):
            item = _scrubbed(item, mode, f"memories.{i}")
            # NOTE: the id names the record's shard (records.id_route), so a read by id asks only
            # that shard; a shared record without a source id gets a fresh one to route by.
            if tenant == SHARED_TENANT_NAME:
                source_id = item.source_id or new_record_id()
                record_id = shared_record_id(source_id)
            else:
                record_id = private_record_id()
                source_id = item.source_id or record_id
            # NOTE: "is None", not "or": a memory sent as created at the epoch (0) was stored as created now.
            created = to_epoch(item.created_at)
            try:
                records.append(MemoryRecord(
                    id=record_id, tenant=tenant, source_id=source_id,
                    kind=item.kind, text=item.text, image_description=item.image_description, ocr_text=item.ocr_text,
                    image_hash=item.image_hash, parts=item.parts, metadata=item.metadata, topic_path=item.topic,
                    created_at=now if created is None else created, expires_at=to_epoch(item.expires_at),
                    retention_weight=item.retention_weight, error_tags=item.error_tags,
                    user=None if item.user is None else user_key(item.user, mode),
                ))
            except ValidationError as exc:
                # NOTE: the record's own checks (an empty metadata key, an expiry before now): the
                # field by its request name, and never pydantic's dump of the whole record.
                err = dict(exc.errors()[0])
                err["loc"] = tuple(_REQUEST_NAMES.get(str(p), p) for p in err.get("loc", ()))
                param, message = describe_error(err, f"memories.{i}")
                raise APIError(400, message, param=param) from None
            except ValueError as exc:
                raise APIError(400, f"memories.{i}: {exc}", param=f"memories.{i}") from None
        return await self.add_records(records)

    async def add_records(self, records: Sequence[MemoryRecord]) -> list[str]:
        """Embed and store records (their tenants already set by the caller); durable on return."""
        if not records:
            return []
        if len(records) > self.max_batch:
            raise APIError(400, f"memories: at most {self.max_batch} per request, got {len(records)}", param="memories")
        records = [self._chunked(r) for r in records]
        texts = [r.embedding_texts() for r in records]
        flat = [t for group in texts for t in group]
        vectors = np.asarray(await self.embed(flat), dtype=np.float32)
        if vectors.shape[0] != len(flat):
            raise RuntimeError(f"embedder returned {vectors.shape[0]} vectors for {len(flat)} texts")
        items, start = [], 0
        for rec, group in zip(records, texts):
            items.append(EmbeddedRecord(rec, vectors[start : start + len(group)]))
            start += len(group)
        with _shards_up():
            return await self.coordinator.upsert(items)

    def _chunked(self, record: MemoryRecord) -> MemoryRecord:
        """``record`` with its text's chunk spans set when the text is longer than one chunk (see memory_shards.chunking)."""
        if record.text_chunks or self.chunk_tokens is None:
            return record
        spans = chunk_spans(record.text, self.chunk_tokens, min(DEFAULT_OVERLAP_TOKENS, self.chunk_tokens // 4))
        # NOTE: model_validate (not model_copy) so the spans pass the record's own checks.
        return MemoryRecord.model_validate({**record.model_dump(), "text_chunks": spans}) if spans else record

    async def delete(self, tenant: str, memory_id: str) -> None:
        """Delete one of ``tenant``'s memories (durable on return).

        Raises:
            APIError: 404 when ``tenant`` has no such memory, 403 for a shared one.
        """
        with _shards_up():
            deleted = await self.coordinator.delete(tenant, [memory_id])
            if memory_id in deleted:
                return
            rec = await self.coordinator.get(tenant, memory_id)
        if rec is not None and rec.is_shared and tenant != SHARED_TENANT_NAME:
            raise APIError(403, f"memory_id: memory {memory_id} is in the shared collection; only its owner may delete it",
                           type="permission_error", param="memory_id")
        raise APIError(404, f"memory_id: memory {memory_id} not found", type="not_found_error", param="memory_id")

    # ---- reads --------------------------------------------------------------------------
    async def get(self, tenant: str, memory_id: str) -> MemoryRecord:
        """One memory ``tenant`` may see (its own or shared), else a 404 (a 503 when its shard is down)."""
        with _shards_up():
            rec = await self.coordinator.get(tenant, memory_id)
        if rec is None or rec.tenant not in (tenant, SHARED_TENANT_NAME):
            raise APIError(404, f"memory_id: memory {memory_id} not found", type="not_found_error", param="memory_id")
        return rec

    async def list_by_source(self, tenant: str, source_id: str) -> list[MemoryRecord]:
        """Memories with ``source_id`` that ``tenant`` may see, oldest first (an id holding
        personal data is looked up by the key its write stored, :func:`recallserve.serve.pii.mask_id`)."""
        if self.pii_for(tenant) != "allow":
            source_id = mask_id(source_id)
        with _shards_up():
            recs = await self.coordinator.list_by_source(tenant, source_id)
        return [r for r in recs if r.tenant in (tenant, SHARED_TENANT_NAME)]

    async def search_request(self, tenant: str, req: SearchRequest, now: float | None = None,
                             caller: str = "api", sub_queries: Sequence[str] = (),
                             sub_query_weight: float = 1.0) -> list[HybridHit]:
        """Run an API search for ``tenant`` (timed into ``recallserve_memory_search_seconds``).

        ``sub_queries`` are searched besides the query and fused with ``sub_query_weight``
        (``HybridRetriever.search``; the eval of query decomposition, never an HTTP request).

        Raises:
            MemoryOverloaded: an ``api`` search the replica did not admit (``admission``).
        """
        if self.admission is None or caller != "api":
            with MEMORY_SEARCH.labels(caller).time():
                return await self._search_request(tenant, req, now, sub_queries, sub_query_weight)
        try:
            async with self.admission.slot(tenant):
                with MEMORY_SEARCH.labels(caller).time():
                    return await self._search_request(tenant, req, now, sub_queries, sub_query_weight)
        except AdmissionRefused as exc:
            raise MemoryOverloaded(exc) from None

    async def _search_request(self, tenant: str, req: SearchRequest, now: float | None, sub_queries: Sequence[str] = (),
                              sub_query_weight: float = 1.0) -> list[HybridHit]:
        req.check_query()
        d = req.decay
        params = ScoreParams(
            threshold=self.threshold if req.threshold is None else req.threshold,
            **(d.model_dump() if d is not None else {}),
        )
        retrieval = self.retriever.params if req.hybrid else self.retriever.params.model_copy(update={"lexical_candidates": 0})
        with _shards_up():
            hits = await self.retriever.search(tenant, req.query, req.k or self.top_k, params,
                                               _filters(req.filters, self.pii_for(tenant)), now, retrieval,
                                               sub_queries=sub_queries, sub_query_weight=sub_query_weight)
        # NOTE: derived memories (written-back conclusions) rank below every source record.
        return sources_first([h for h in hits if h.record.tenant in (tenant, SHARED_TENANT_NAME)])

    # ---- serve.memory.MemoryBackend -----------------------------------------------------
    async def search(self, tenant: str, query: str, k: int | None = None, *, threshold: float | None = None,
                     kinds: Sequence[str] | None = None, topic_prefix: str | None = None,
                     user: str | None = None) -> list[MemoryHit]:
        """The chat pipeline's recall: hybrid top-k of ``tenant`` (plus shared) for ``query``; with
        ``user`` (a stored user key), only that user's memories and the tenant's unowned ones."""
        if not query.strip():
            return []
        filters = None
        if kinds or topic_prefix or user:
            filters = FiltersIn(kinds=list(kinds) if kinds else None, topic_prefix=topic_prefix or None,
                                user=user or None, include_tenant=bool(user))
        req = SearchRequest(query=query, k=min(max(k or self.top_k, 1), MAX_K), threshold=threshold, filters=filters)
        return list(await self.search_request(tenant, req, caller="chat"))

    async def write(self, tenant: str, items: Sequence[MemoryWrite]) -> list[str]:
        """The chat pipeline's write-back (durable on return).

        A text longer than a memory may be (``MAX_TEXT_CHARS``: a chat message may be far longer) is
        stored clipped (:func:`clip_middle`: its start and its end, so a pasted document's exchange keeps
        the question's start and the whole answer), with ``metadata.clipped_chars`` = the characters
        left out; before, the write-back failed in the background and the exchange was not stored.
        """
        ids: list[str] = []
        for start in range(0, len(items), self.max_batch):
            batch = []
            for w in items[start : start + self.max_batch]:
                text, left_out = clip_middle(w.text, MAX_TEXT_CHARS)
                metadata = {**w.metadata, "clipped_chars": left_out} if left_out else w.metadata
                batch.append(MemoryIn(text=text, kind=w.kind, source_id=w.source_id, metadata=metadata,
                                      topic=w.topic or "", created_at=w.created_at, expires_at=w.expires_at,
                                      user=w.user))
            ids += await self.add(tenant, batch, pii=for_write_back(self.pii_for(tenant)))
        return ids
