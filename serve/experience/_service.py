"""The experience service: create, verify, cache, retrieve, inject, review (framework-free).

Every method takes the tenant from the caller (the HTTP layer reads it from the API key);
records of one tenant are invisible to every other. Embeddings come from an injected
``embed(texts) -> np.ndarray`` (rows L2-normalised float32), e.g. the MiniLM embedder of
``memory_shards``.

Example:
    >>> svc = ExperienceService(ExperienceConfig(data_dir="/tmp/exp"), embed=my_embed)  # doctest: +SKIP
    >>> out = await svc.produce("acme", engine, "A car drives 120 km in 1.5 h. Speed?")  # doctest: +SKIP
"""

from __future__ import annotations

import asyncio
import hashlib
import logging
import time
from collections.abc import Awaitable, Callable, Sequence
from typing import Any

import numpy as np
from pydantic import ValidationError

from recallserve.memory_shards.retrieval import LexicalIndex
from recallserve.serve.engine import ChatMessage, GenerationParams, LLMEngine
from recallserve.serve.experience._caches import (
    decay_factor,
    demotions,
    evicted_domains,
    find_conflicts,
    model_family,
    rank_active,
    reuse_key,
)
from recallserve.serve.experience._clean import clean_context
from recallserve.serve.experience._extract import problem_check_types
from recallserve.serve.experience._metrics import record_conflicts, record_lookup, record_verification, set_active_freshness
from recallserve.serve.experience._models import (
    ConflictAlert,
    ExperienceConfig,
    ExperienceHit,
    ExperienceView,
    LabelRequest,
    MaintenanceReport,
    ProduceResult,
    SearchRequest,
    SearchResult,
)
from recallserve.serve.experience._parser import ParseReport, parse_segmented
from recallserve.serve.experience._pool import VerifyPool
from recallserve.serve.experience._prompt import (
    SYSTEM_PROMPT,
    SYSTEM_PROMPT_JSON,
    build_messages,
    required_checks,
    rewrite_messages,
)
from recallserve.serve.experience._rules import RuleTable
from recallserve.serve.experience._schema import (
    ExperienceContext,
    ExperienceEvaluation,
    ExperienceMetadata,
    ExperienceOutcome,
    ExperienceRecord,
    Tier,
)
from recallserve.serve.experience._store import ExperienceStore, StoredRow
from recallserve.serve.experience._verify import exposure_tags, verify_record, with_extracted_checks
from recallserve.serve.memory import MemoryBackend, MemoryWrite
from recallserve.serve.pii import MaskedValueError, PiiMode, apply_pii, for_write_back, user_key

__all__ = ["ExperienceService", "ExperienceNotFound", "Embedder"]

log = logging.getLogger(__name__)
Embedder = Callable[[Sequence[str]], np.ndarray]
_DAY = 86400.0


def _tier_of(record: ExperienceRecord) -> Tier:
    """Review before reuse: where a new record goes.

    ``active`` only when a reviewer labelled it ``correct``, or when it is unlabelled and its
    verification passed with confidence ``high`` (every check executed by code passed, and there
    was at least one: :func:`~._verify.derive_confidence`). Everything else (labelled ``wrong``,
    ``medium`` or ``low`` confidence) waits in ``review``: a trace nobody verified is never reused.
    """
    label = record.evaluation.human_label
    if label == "correct" or (label is None and record.outcome.confidence == "high"):
        return "active"
    return "review"


def audit_pick(tenant: str, exp_id: str, share: float) -> bool:
    """Whether an auto-accepted record is drawn for the audit sample.

    ``u = first 8 bytes of sha256(tenant + id) / 2^64``; drawn when ``u < share``. A hash rather
    than a random draw: the same record is drawn on every replica and after a restart (re-posting
    a record cannot dodge the audit), and over many ids the drawn share converges to ``share``.
    """
    if share <= 0.0:
        return False
    u = int.from_bytes(hashlib.sha256(f"{tenant}\x00{exp_id}".encode()).digest()[:8], "big") / 2.0**64
    return u < share


class ExperienceNotFound(KeyError):
    """No record with this id for this tenant."""

    def __str__(self) -> str:
        return str(self.args[0]) if self.args else ""


class ExperienceService:
    """Segmented experience memory with active and archival caches and a review queue.

    Args:
        config: Settings (data dir, capacities, weights, rules).
        embed: ``embed(texts) -> (n, d)`` L2-normalised float32 array.
        memory: Optional memory tier; each record's segments are also written there as
            ``experience`` memories (source id ``experience:<id>:<segment>``).
        clock: Time source in epoch seconds (tests pass a fake clock).
        store: Where records live; None opens ``ExperienceStore(config.data_dir)``. A cluster
            passes a proxy with the same async methods (one store shared by every ingress replica).
        pii_for: tenant -> PII policy of its records (``Authenticator.pii_for``); default: mask.
            Applied to every text of a record before it is verified, stored or written to memory.
        rewriter: the light (router) model; when a segmented reply does not parse, it is asked
            once to rewrite the reply into the format (``parse_fallback``). None = no rewrite.
    """

    def __init__(self, config: ExperienceConfig, embed: Embedder, *, memory: MemoryBackend | None = None,
                 clock: Callable[[], float] = time.time, family_of: Callable[[str], str] = model_family,
                 store: ExperienceStore | None = None, pii_for: Callable[[str], PiiMode] | None = None,
                 rewriter: LLMEngine | None = None) -> None:
        self.config = config
        self.rules = RuleTable(config.rules)
        self.store = ExperienceStore(config.data_dir) if store is None else store
        self._embed = embed
        self._memory = memory
        self._clock = clock
        self._family_of = family_of
        self._pii_for: Callable[[str], PiiMode] = pii_for or (lambda _tenant: "mask")
        self._rewriter = rewriter
        self._pool = (VerifyPool(config.verify_workers, config.verify_queue, config.verify_timeout_ms / 1e3)
                      if config.verify_workers else None)

    def _reuser(self, model: str) -> Callable[[list[StoredRow]], list[StoredRow]]:
        """A filter of rows down to those ``model`` may reuse: its own, or its family's when
        ``shared_families`` names the family (:func:`~._caches.reuse_key`).

        NOTE: rows are stored under the coarse family (:func:`~._caches.model_family`), so records
        written before this rule stay reachable; the finer cut is made here, on read.
        """
        shared = self.config.shared_families
        key = reuse_key(model, shared)
        return lambda rows: [r for r in rows if reuse_key(r.record.metadata.source_model, shared) == key]

    def close(self) -> None:
        """Close the database and stop the verification workers."""
        if self._pool is not None:
            self._pool.close()
        self.store.close()

    # ------------------------------------------------------------------ helpers

    async def _embed_one(self, text: str) -> np.ndarray:
        vec = await asyncio.to_thread(self._embed, [text])
        arr = np.asarray(vec, dtype=np.float32)
        if arr.ndim != 2 or arr.shape[0] != 1:
            raise ValueError(f"embed() must return one row per text, got shape {arr.shape}")
        return arr[0]

    def _view(self, row: StoredRow, now: float) -> ExperienceView:
        return ExperienceView(record=row.record, tier=row.tier, last_used_at=row.last_used_at, use_count=row.use_count,
                              decay=decay_factor(now, row.last_used_at, self.config.decay_rate))

    async def _refresh_freshness(self, now: float) -> None:
        set_active_freshness(await self.store.active_freshness(now, self.config.decay_rate))

    async def _enforce_scope(self, tenant: str, domain: str, now: float) -> dict[str, int]:
        rows = await self.store.query(tenant, tiers=("active",), domain=domain)
        demote = demotions(rows, now=now, capacity=self.config.active_capacity,
                           window_days=self.config.active_window_days, demote_below=self.config.demote_below,
                           decay_rate=self.config.decay_rate)
        if demote:
            await self.store.set_tier(tenant, demote.keys(), "archival")
        counts: dict[str, int] = {}
        for reason in demote.values():
            counts[reason] = counts.get(reason, 0) + 1
        return counts

    async def _enforce_domains(self, tenant: str, keep: str | None) -> dict[str, int]:
        """Demote the active records of ``tenant``'s least recently used domains past
        ``max_active_domains`` (:func:`~._caches.evicted_domains`; ``keep``: the domain just written).

        NOTE: eviction, not a 4xx: every other bound of the active cache demotes, and a demoted
        record is kept (an archival lesson), so a tenant is never refused a new domain for the ones it
        used before; only its own records move.
        """
        evicted = evicted_domains(await self.store.active_domains(tenant), self.config.max_active_domains, keep)
        ids = [r.id for d in evicted for r in await self.store.query(tenant, tiers=("active",), domain=d)]
        if ids:
            await self.store.set_tier(tenant, ids, "archival")
        return {"domains": len(ids)} if ids else {}

    # ------------------------------------------------------------------ records

    async def _verify(self, tenant: str, record: ExperienceRecord, required: Sequence[str]) -> ExperienceRecord:
        """Verify by code in a worker process (or thread), within the configured budget; count the results.

        NOTE: off the event loop because verification is CPU work on client input: even bounded
        to milliseconds, many records at once would stall every other request of the replica; and
        off the interpreter (a process, ``verify_workers``) because a thread still takes its GIL.
        """
        if self.config.extracted_checks:
            # NOTE: the checks of the context's quantities are derived here (cleaning and a regex
            # pass, milliseconds, off the loop) and executed with the model's in the same budget.
            record = await asyncio.to_thread(with_extracted_checks, record)
        kwargs = {"required": required, "max_steps": self.config.verify_max_steps,
                  "seconds": self.config.verify_budget_ms / 1e3}
        if self._pool is None:
            verified = await asyncio.to_thread(verify_record, record, self.rules, **kwargs)
        else:
            verified = await self._pool.verify(record, self.rules, tenant=tenant, **kwargs)
        record_verification((v.status for v in verified.verification), tenant)
        return verified

    async def create(self, tenant: str, record: ExperienceRecord, *, required: Sequence[str] = (),
                     pii: PiiMode | None = None) -> ExperienceView:
        """Verify a record by code, derive its confidence and file it in a tier.

        Tier (review before reuse): labelled ``correct``, or unlabelled with confidence ``high``
        -> ``active``; everything else -> ``review``. A share ``audit_share`` of the unlabelled
        active records is also marked ``evaluation.audit`` and listed in the review queue. The same
        (tenant, id) overwrites. ``pii``: the policy applied to
        the record's texts (default: the tenant's).

        Raises:
            PersonalDataError: under ``reject``, naming the field (``context.raw_text``).
        """
        now = self._clock()
        mode = self._pii_for(tenant) if pii is None else pii
        record = _scrubbed(record, mode)
        if record.metadata.user is not None:
            # NOTE: the owner is stored under the key the chat turn and the erasure use (serve.pii.user_key).
            record = record.model_copy(update={"metadata": record.metadata.model_copy(
                update={"user": user_key(record.metadata.user, mode)})})
        verified = await self._verify(tenant, record, required)
        md = verified.metadata
        if md.expires_at is None and self.config.default_ttl_days is not None:
            md = md.model_copy(update={"expires_at": md.timestamp + self.config.default_ttl_days * _DAY})
            verified = verified.model_copy(update={"metadata": md})
        tier = _tier_of(verified)
        if (tier == "active" and verified.evaluation.human_label is None
                and audit_pick(tenant, md.id, self.config.audit_share)):
            verified = verified.model_copy(update={"evaluation": verified.evaluation.model_copy(update={"audit": True})})
        emb = await self._embed_one(clean_context(verified.search_text()))
        await self.store.put(tenant, verified, tier=tier, family=self._family_of(md.source_model), embedding=emb,
                       last_used_at=min(md.timestamp, now))
        if tier == "active":
            await self._enforce_scope(tenant, md.task_domain, now)
            await self._enforce_domains(tenant, md.task_domain)
        await self._refresh_freshness(now)
        await self._write_memories(tenant, verified, tier)
        row = await self.store.get(tenant, md.id)
        assert row is not None  # written just above under the same key
        return self._view(row, now)

    async def _write_memories(self, tenant: str, record: ExperienceRecord, tier: Tier) -> None:
        if self._memory is None:
            return
        md = record.metadata
        writes = [
            MemoryWrite(text=text, kind="experience", source_id=f"experience:{md.id}:{seg}", topic=md.topic,
                        created_at=md.timestamp, expires_at=md.expires_at, user=md.user,
                        metadata={"experience_id": md.id, "segment": seg, "tier": tier,
                                  "source_model": md.source_model, "task_domain": md.task_domain})
            for seg, text in record.segment_texts().items() if text.strip()
        ]
        try:
            await self._memory.write(tenant, writes)
        except Exception as exc:  # noqa: BLE001 - the record is durable in SQLite; the index is secondary
            log.warning("experience %s: writing segments to the memory tier failed: %s", md.id, exc)

    async def get(self, tenant: str, exp_id: str) -> ExperienceView:
        """One record of ``tenant``; raises ExperienceNotFound. An expired record is read from archival
        (it is moved there now if maintenance has not yet done it)."""
        now = self._clock()
        row = await self.store.get(tenant, exp_id)
        if row is None:
            raise ExperienceNotFound(f"experience {exp_id!r} not found")
        md = row.record.metadata
        if row.tier == "active" and md.expires_at is not None and md.expires_at <= now:
            await self.store.set_tier(tenant, [exp_id], "archival")
            row.tier = "archival"
        return self._view(row, now)

    # ------------------------------------------------------------------ retrieval

    async def search(self, tenant: str, req: SearchRequest) -> SearchResult:
        """Active hits ranked by recency and similarity, archival hits by topic / error tags.

        Active candidates share the request's model family (and domain when given), are
        unexpired, and are demoted first when their decay or window has run out. Each used
        record's last-use time is refreshed. Conflicts replace the older active record by
        the newer archival one and are reported.
        """
        now = self._clock()
        if self._pii_for(tenant) != "allow":  # NOTE: masked as the records' were (_scrubbed), or they matched none
            req = req.model_copy(update={f: apply_pii(getattr(req, f), "mask") for f in ("source_model", "domain")})
        family = self._family_of(req.source_model)
        reuser = self._reuser(req.source_model)
        query = await self._embed_one(clean_context(req.query)) if req.query.strip() else None
        domains = [req.domain] if req.domain else sorted({r.record.metadata.task_domain for r in await self.store.query(
            tenant, tiers=("active",), family=family)})
        for d in domains:
            await self._enforce_scope(tenant, d, now)
        active = reuser(await self.store.query(tenant, tiers=("active",), domain=req.domain, family=family, now=now))
        if query is not None:
            ranked = rank_active(active, query, now=now, k=req.k, recency_weight=self.config.recency_weight,
                                 min_similarity=self.config.min_similarity, decay_rate=self.config.decay_rate,
                                 keyword_ranking=_keyword_ranking(tenant, active, req.query)
                                 if self.config.hybrid else None)
        else:
            ranked = rank_active(active, np.zeros_like(active[0].embedding) if active else np.zeros(1, np.float32),
                                 now=now, k=req.k, recency_weight=1.0, decay_rate=self.config.decay_rate)
        result = SearchResult()
        conflicts = []
        if ranked:
            topics = {r.row.record.metadata.topic for r in ranked}
            arch = [a for t in topics for a in reuser(await self.store.query(
                tenant, tiers=("archival",), family=family, topic_prefix=t, now=now)) if a.record.metadata.topic == t]
            conflicts = find_conflicts([r.row for r in ranked], arch)
        newer_for = {c.active.id: c.newer for c in conflicts}
        used: list[tuple[str, float, str]] = []
        seen: set[str] = set()
        for r in ranked:
            row, preferred_over = r.row, None
            if row.id in newer_for:
                row, preferred_over = newer_for[row.id], r.row.id
            if row.id in seen:
                continue
            seen.add(row.id)
            rec = row.record.model_copy(update={"evaluation": row.record.evaluation.model_copy(
                update={"retrieval_score": r.score})})
            used.append((row.id, now, rec.model_dump_json()))
            row.record, row.last_used_at, row.use_count = rec, now, row.use_count + 1
            result.hits.append(ExperienceHit(experience=self._view(row, now), score=r.score, similarity=r.similarity,
                                             recency=r.recency, preferred_over=preferred_over))
        for c in conflicts:
            md_a, md_n = c.active.record.metadata, c.newer.record.metadata
            msg = (f"active experience {md_a.id} on topic {md_a.topic!r} is older than archival {md_n.id}; "
                   f"preferring the newer one")
            log.warning(msg)
            result.conflicts.append(ConflictAlert(topic=md_a.topic, active_id=md_a.id, newer_id=md_n.id,
                                                  active_timestamp=md_a.timestamp, newer_timestamp=md_n.timestamp,
                                                  message=msg))
        record_conflicts(len(conflicts))
        await self.store.touch(tenant, used)
        if query is not None:
            record_lookup(bool(result.hits), tenant)
        if req.archival_k:
            result.archival = await self._search_archival(tenant, req, family, query, now)
        await self._refresh_freshness(now)
        return result

    async def _search_archival(self, tenant: str, req: SearchRequest, family: str, query: np.ndarray | None,
                               now: float) -> list[ExperienceHit]:
        rows = self._reuser(req.source_model)(await self.store.query(
            tenant, tiers=("archival",), domain=req.domain, family=family, topic_prefix=req.topic_prefix, now=now))
        if req.error_tags:
            wanted = set(req.error_tags)
            rows = [r for r in rows if wanted & set(r.record.evaluation.error_tags)]
        if query is not None and rows:
            sims = np.stack([r.embedding for r in rows]) @ query
            order = sorted(range(len(rows)), key=lambda i: (-float(sims[i]), rows[i].id))
            scored = [(rows[i], float(max(sims[i], 0.0))) for i in order]
        else:  # NOTE: rows come newest-used first from the store.
            scored = [(r, 0.0) for r in rows]
        return [ExperienceHit(experience=self._view(r, now), score=s, similarity=s, recency=0.0)
                for r, s in scored[: req.archival_k]]

    async def _lessons(self, tenant: str, question: str, model: str, domain: str, topic: str,
                       tags: Sequence[str]) -> list[ExperienceRecord]:
        """At most ``archival_k`` archival records of the topic for the prompt: those carrying one of
        ``tags`` first (by similarity), then the topic's other records (by similarity)."""
        k = self.config.archival_k
        if k == 0:
            return []
        base = SearchRequest(query=question, source_model=model, domain=domain, topic_prefix=topic, archival_k=k)
        family = self._family_of(model)
        query = await self._embed_one(clean_context(question)) if question.strip() else None
        now = self._clock()
        hits = await self._search_archival(tenant, base.model_copy(update={"error_tags": list(tags)}), family,
                                           query, now) if tags else []
        if len(hits) < k:
            seen = {h.experience.record.metadata.id for h in hits}
            hits += [h for h in await self._search_archival(tenant, base, family, query, now)
                     if h.experience.record.metadata.id not in seen][: k - len(hits)]
        return [h.experience.record for h in hits[:k]]

    # ------------------------------------------------------------------ review

    async def review_queue(self, tenant: str, limit: int = 50) -> list[ExperienceView]:
        """Records waiting for a person, oldest first: the ``review`` tier (labelled wrong, or not
        verified with high confidence) and the audit sample (active, ``evaluation.audit``, unlabelled).

        NOTE: audit rows are read from the active tier, which is bounded by ``active_capacity`` per
        domain and ``max_active_domains`` domains, so the scan is bounded too.
        """
        now = self._clock()
        review = await self.store.query(tenant, tiers=("review",), now=now, limit=limit, order="created_at ASC")
        audit = [r for r in await self.store.query(tenant, tiers=("active",), now=now, order="created_at ASC")
                 if r.record.evaluation.audit and r.record.evaluation.human_label is None]
        waiting = sorted(review + audit, key=lambda r: (r.record.metadata.timestamp, r.id))
        return [self._view(r, now) for r in waiting[:limit]]

    async def label(self, tenant: str, exp_id: str, req: LabelRequest) -> ExperienceView:
        """Apply a reviewer's label: ``correct`` -> active cache, ``wrong`` -> archival with its tags."""
        now = self._clock()
        view = await self.get(tenant, exp_id)
        row = await self.store.get(tenant, exp_id)
        assert row is not None
        rec = view.record
        mode = self._pii_for(tenant)
        # NOTE: the policy reads the tags too (an SSN is a valid tag), and the masked request is
        # validated again, so the record is never stored with a field its reads refuse (model_copy
        # does not validate: a masked note over 2,000 characters made every read of it a 500).
        try:
            req = LabelRequest.model_validate(apply_pii(req.model_dump(), mode))
        except ValidationError as exc:
            raise MaskedValueError.from_validation(exc.errors()) from None
        evaluation = rec.evaluation.model_copy(update={
            "human_label": req.label,
            "error_tags": (req.error_tags + [t for t in rec.evaluation.error_tags if t not in req.error_tags])[:16],
            "review_note": req.note,
        })
        md = rec.metadata.model_copy(update={"reviewer": req.reviewer or tenant})
        rec = rec.model_copy(update={"evaluation": evaluation, "metadata": md})
        tier: Tier = "active" if req.label == "correct" else "archival"
        await self.store.put(tenant, rec, tier=tier, family=row.family, embedding=row.embedding,
                       last_used_at=now if tier == "active" else row.last_used_at, use_count=row.use_count)
        if tier == "active":
            await self._enforce_scope(tenant, md.task_domain, now)
            await self._enforce_domains(tenant, md.task_domain)
        await self._refresh_freshness(now)
        return await self.get(tenant, exp_id)

    # ------------------------------------------------------------------ maintenance

    async def maintain(self) -> MaintenanceReport:
        """Move expired active records to archival and demote old / over-capacity ones, all tenants."""
        now = self._clock()
        expired = await self.store.archive_expired(now)
        demoted: dict[str, int] = {}
        for tenant in await self.store.tenants():
            # NOTE: domains first (a store written before the bound, or a lowered bound), then each
            # remaining domain's own scope.
            for reason, n in (await self._enforce_domains(tenant, None)).items():
                demoted[reason] = demoted.get(reason, 0) + n
            for d, _ in await self.store.active_domains(tenant):
                for reason, n in (await self._enforce_scope(tenant, d, now)).items():
                    demoted[reason] = demoted.get(reason, 0) + n
        fresh = await self.store.active_freshness(now, self.config.decay_rate)
        set_active_freshness(fresh)
        return MaintenanceReport(expired_archived=expired, demoted=demoted, freshness=fresh)

    # ------------------------------------------------------------------ generation

    def system_prompt(self) -> str:
        """The segmented format's system prompt (line or JSON format, per ``constrain_json``)."""
        return SYSTEM_PROMPT_JSON if self.config.constrain_json else SYSTEM_PROMPT

    async def produce(
        self, tenant: str, engine: LLMEngine, question: str, *, domain: str = "general", topic: str = "general",
        inject: bool = True, params: GenerationParams | None = None, store: bool = True,
        prompt: Callable[[str, str], list[ChatMessage]] | None = None, user: str | None = None,
        may_store: Callable[[], Awaitable[bool]] | None = None,
    ) -> ProduceResult:
        """Ask the reasoner for the four segments, parse, verify by code and store the trace.

        With ``inject``, the best active experiences of the same model family and domain and at
        most ``archival_k`` archival lessons of the topic go into the prompt, and the check types
        they imply are required in the new answer (a missing one makes the trace at most
        ``medium``). The lessons are searched by topic path and by the error tags of the mistakes
        the problem exposes (:func:`~._extract.problem_check_types` -> :func:`~._verify.exposure_tags`):
        tagged lessons first, the topic's others after. The new trace's failed checks become its
        own error tags (:func:`~._verify.error_tags_for`).
        ``prompt(head, problem)`` renders the engine prompt from the segmented format (system) and
        the problem text with its injected experiences (the chat turn passes its renderer, so the
        client's system prompt, the context block, history and memories reach the model too);
        None = just those two messages. ``user``: the end user's stored key, kept as ``metadata.user``
        (what erasing that user finds the trace and its memory segments by). ``may_store``: asked once
        the answer is generated, before anything is stored (the chat's erasure check: a user asked to
        be erased while the trace was generating gets the answer, and nothing of it is stored).
        """
        experiences: list[ExperienceRecord] = []
        archival: list[ExperienceRecord] = []
        tags: list[str] = []
        if inject:
            found = await self.search(tenant, SearchRequest(
                query=question, source_model=engine.model_name, domain=domain, k=self.config.top_k))
            experiences = [h.experience.record for h in found.hits]
            # NOTE: the mistakes this problem can make (the check types it will be held to) are
            # the error tags the archive is asked about; the topic's other lessons fill the rest.
            tags = exposure_tags(problem_check_types(question, rule_domain=bool(self.rules.rules(domain)),
                                                     required=required_checks(experiences)))
            archival = await self._lessons(tenant, question, engine.model_name, domain, topic, tags)
        messages, required = build_messages(question, experiences=experiences, archival=archival,
                                            rules=self.rules.rules(domain), json_mode=self.config.constrain_json)
        if prompt is not None:
            messages = prompt(messages[0].content, messages[1].content)
        gen = params or GenerationParams(max_tokens=self.config.max_tokens, temperature=0.0, seed=0,
                                         json_schema=_JSON_SCHEMA if self.config.constrain_json else None)
        result = await engine.chat(messages, gen)
        parsed = parse_segmented(result.text)
        first_report: ParseReport | None = None
        prompt_tokens, completion_tokens = result.prompt_tokens, result.completion_tokens
        if not parsed.report.ok and self._rewriter is not None and self.config.parse_fallback:
            # NOTE: one rewrite by the light router model, never more: a reply it cannot put into
            # the format either is kept unparsed for a person (below).
            first_report = parsed.report
            rewrite = await self._rewriter.chat(rewrite_messages(result.text, self.config.constrain_json),
                                                gen.model_copy(update={"temperature": 0.0}))
            prompt_tokens += rewrite.prompt_tokens
            completion_tokens += rewrite.completion_tokens
            rewritten = parse_segmented(rewrite.text)
            if rewritten.report.ok or (rewritten.answer and not parsed.answer):
                parsed = rewritten
        view: ExperienceView | None = None
        store = store and (may_store is None or await may_store())
        if not parsed.answer and store and result.text.strip():
            view = await self.create(tenant, _unparsed(question, result.text, ExperienceMetadata(
                source_model=engine.model_name, task_domain=domain, topic=topic, timestamp=self._clock(), user=user)),
                pii=for_write_back(self._pii_for(tenant)))
        if parsed.answer:
            record = parsed.to_record(question, ExperienceMetadata(
                source_model=engine.model_name, task_domain=domain, topic=topic, timestamp=self._clock(), user=user))
            if store:
                view = await self.create(tenant, record, required=required,
                                         pii=for_write_back(self._pii_for(tenant)))
            else:
                now = self._clock()
                verified = await self._verify(tenant, record, required)
                view = ExperienceView(record=verified, tier=_tier_of(verified), last_used_at=now, use_count=0,
                                      decay=1.0)
        return ProduceResult(
            answer=parsed.answer, experience=view, report=parsed.report, first_report=first_report,
            injected=[r.metadata.id for r in experiences], required_checks=required, raw_text=result.text,
            archival=[r.metadata.id for r in archival], searched_tags=tags,
            prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
        )


def _keyword_ranking(tenant: str, rows: Sequence[StoredRow], query: str) -> list[str]:
    """Ids of ``rows`` ranked by BM25 of their cleaned search text against the cleaned query.

    The memory tier's lexical index (same analysis: stems, stop words, numbers kept), built per
    search over the candidate rows: they are one tenant's active records of one model family,
    ``active_capacity`` per domain of ``max_active_domains``, so the index is bounded and never stale.
    """
    if not rows:
        return []
    index = LexicalIndex()
    index.add_many((tenant, r.id, clean_context(r.record.search_text())) for r in rows)
    return [i for i, _ in index.search(tenant, clean_context(query), len(rows))]


UNPARSED_TAG = "unparsed"


def _unparsed(question: str, reply: str, metadata: ExperienceMetadata) -> ExperienceRecord:
    """A reply that neither the parser nor the rewrite could read, kept for review: no segments,
    the reply itself as the outcome's explanation, tagged ``unparsed`` (confidence medium: no
    checks, so it is filed in review, never reused)."""
    return ExperienceRecord(
        metadata=metadata, context=ExperienceContext(raw_text=question[:8000]),
        outcome=ExperienceOutcome(answer=UNPARSED_TAG, explanation=reply[:2000]),
        evaluation=ExperienceEvaluation(error_tags=[UNPARSED_TAG]),
    )


# NOTE: the id, schema version and timestamps are patterned or numeric; the policy reads the free
# texts, the checks' free-form values, and the metadata's labels: a reviewer, a task domain, a topic
# path and a model name are free text a client sets (an e-mail as the reviewer was stored as sent).
_PII_SEGMENTS = ("context", "reasoning", "verification", "outcome", "evaluation")
_PII_METADATA = ("source_model", "task_domain", "topic", "reviewer")


def _scrubbed(record: ExperienceRecord, mode: PiiMode) -> ExperienceRecord:
    """``record`` with the PII policy applied to its segments and metadata labels (the same object
    when nothing changed).

    Raises:
        PersonalDataError: under ``reject``, naming the field (``metadata.reviewer``).
        MaskedValueError: a masked field no longer fits its bound or shape (a 400 naming it).
    """
    if mode == "allow":
        return record
    dumped = record.model_dump()
    texts = {name: dumped[name] for name in _PII_SEGMENTS}
    texts["metadata"] = {name: dumped["metadata"][name] for name in _PII_METADATA}
    out = {name: apply_pii(value, mode, name) for name, value in texts.items()}
    if out == texts:
        return record
    try:
        return ExperienceRecord.model_validate({**dumped, **out, "metadata": {**dumped["metadata"], **out["metadata"]}})
    except ValidationError as exc:
        # NOTE: a tag can be longer than the value it masks, and is no error tag or topic ("123-45-6789").
        raise MaskedValueError.from_validation(exc.errors()) from None


_CHECK = {
    "type": "object",
    "properties": {
        "type": {"enum": ["recomputation", "unit_check", "back_substitution", "boundary_test", "regulatory_check"]},
        "target": {"type": "string"}, "input": {"type": "object"}, "expected": {},
    },
    "required": ["type", "target"],
}
# NOTE: a loose schema on purpose: tight nested schemas slow grammar-constrained sampling.
_JSON_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "context": {"type": "object"},
        "reasoning": {"type": "array", "items": {"type": "object"}},
        "verification": {"type": "array", "items": _CHECK},
        "outcome": {"type": "object", "properties": {"answer": {"type": "string"},
                                                     "confidence": {"enum": ["high", "medium", "low"]},
                                                     "explanation": {"type": "string"}},
                    "required": ["answer", "confidence"]},
    },
    "required": ["context", "reasoning", "verification", "outcome"],
}
