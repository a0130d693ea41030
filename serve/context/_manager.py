"""ContextManager: the one object the ingress talks to for sessions, context and summaries.

Per request the ingress does::

    session = await ctx.open_session(tenant, user, session_id)
    result = await ctx.assemble(session, [MessageIn(role="user", content=q)],
                                context_window=engine.context_window, reserved_output=max_tokens,
                                system=system_prompt, mode=request_mode)   # ContextBudgetError -> 400
    prompt = render(result.block, result.window, pending)  # the caller's renderer (the chat turn's)
    reply = await engine.chat(prompt, params)  # response metadata: result.response_metadata()
    await ctx.append(session, [MessageIn(role="user", content=q), MessageIn(role="assistant", content=reply.text)])
    ctx.start_summary(session)        # off the request path: a task (result None when not due)

``refresh_summary`` is the coroutine behind ``start_summary`` for callers that schedule work
themselves (a Ray task, the summariser deployment's queue).

Personal data: the tenant's PII policy (``pii_for``) is applied here, before the store is
called, to every stored message (so the entity table, extracted from the stored text, never
sees what was masked) and to every rolling summary. ``reject`` masks here: the chat edge has
already refused the client's personal data, and an answered turn must not fail on its way in.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import Callable, Sequence

from recallserve.serve.context._assemble import MESSAGE_OVERHEAD, AssemblyInput, assemble
from recallserve.serve.context._categorise import Categoriser, Classifier, RuleCategoriser
from recallserve.serve.context._entities import Entity, extract_entities
from recallserve.serve.context._metrics import (
    CONTEXT_ASSEMBLY_SECONDS,
    CONTEXT_MODE_TOTAL,
    CONTEXT_SUMMARY_RUNS_TOTAL,
    CONTEXT_SUMMARY_SECONDS,
    CONTEXT_TOKENS,
)
from recallserve.serve.context._retrieval import Embed, EmbeddingCache
from recallserve.serve.context._store import SessionStore
from recallserve.serve.context._summary import (
    ExtractiveSummariser,
    Summariser,
    plan_batches,
    render_messages,
    summary_candidates,
)
from recallserve.serve.pii import PiiMode, apply_pii, for_write_back
from recallserve.serve.context._types import (
    default_retention,
    Category,
    ContextConfig,
    ContextResult,
    ContextError,
    Message,
    MessageIn,
    ModeName,
    Session,
    SummaryState,
)
from recallserve.serve.tokens import OFFLOAD_CHARS, CachedCounter, TiktokenCounter, TokenCounter

__all__ = ["ContextManager"]

_LOG = logging.getLogger(__name__)


class ContextManager:
    """Sessions, categorisation, budgeted context assembly and the rolling summary.

    Args:
        store: the session store (None: only :meth:`fit`, for client-sent histories, works).
        config: assembly and summary settings.
        counter: token counter (default offline tiktoken cl100k_base; pass
            :class:`~recallserve.serve.tokens.EngineTokenCounter` to count with the model's own tokenizer).
        embed: ``embed(texts) -> np.ndarray`` for retrieval and auto's discreteness (None disables both).
        summariser: rolling-summary writer (default: :class:`ExtractiveSummariser`, no model).
        classifier: optional router-model classifier for messages the rules call ``chat``.
        clock: time source, epoch seconds (tests pass a fake one to step through cooldowns).
        pii_for: tenant -> PII policy (``Authenticator.pii_for``); default: mask.
    """

    def __init__(
        self, store: SessionStore | None, config: ContextConfig | None = None, *, counter: TokenCounter | None = None,
        embed: Embed | None = None, summariser: Summariser | None = None, classifier: Classifier | None = None,
        clock: Callable[[], float] = time.time, pii_for: Callable[[str], PiiMode] | None = None,
    ) -> None:
        self.store = store
        self.config = config or ContextConfig()
        self.counter = CachedCounter(counter or TiktokenCounter())
        self.embeddings = EmbeddingCache(embed) if embed is not None else None
        self.summariser = summariser or ExtractiveSummariser(self.counter)
        self._categoriser = Categoriser(classifier)
        self._rules = RuleCategoriser()
        self._clock = clock
        self._pii_for: Callable[[str], PiiMode] = pii_for or (lambda _tenant: "mask")
        # NOTE: keyed (tenant, session id): each tenant has its own session ids.
        self._running: set[tuple[str, str]] = set()
        self._tasks: set[asyncio.Task[SummaryState | None]] = set()

    def _store(self) -> SessionStore:
        if self.store is None:
            raise ContextError("server-side sessions are not enabled on this server (no session store)")
        return self.store

    async def open_session(
        self, tenant: str, user: str, session_id: str | None = None, *, mode: ModeName | None = None,
    ) -> Session:
        """Get or create a session; a new one starts with the user's carried constraints and facts.

        Raises:
            SessionNotFoundError: the id belongs to another tenant or user.
        """
        return await self._store().open(
            tenant, user, session_id or uuid.uuid4().hex, mode=mode,
            carry_over=self.config.carry_over_items, now=self._clock(),
        )

    async def set_mode(self, session: Session, mode: ModeName | None) -> None:
        """Set the session's default mode (None = the config default)."""
        await self._store().set_mode(session.tenant, session.user, session.id, mode)

    async def _scan_messages(
        self, messages: Sequence[MessageIn], *, entities: bool, pii: PiiMode | None = None,
    ) -> list[tuple[MessageIn, Category, list[Entity]]]:
        """``(message, rule category, entities)`` per message, from one entity scan of each text.

        ``pii``: the policy applied to each content first (what is stored is what is scanned).
        ``entities``: extract them (tool results never get any); else only the categories are read.
        Batches over :data:`~recallserve.serve.tokens.OFFLOAD_CHARS` characters run in a worker thread: the
        regexes cost ~2 us per character, so a 1M-character chat held the event loop for seconds.
        """
        def run() -> list[tuple[MessageIn, Category, list[Entity]]]:
            out = []
            for m in messages:
                if pii is not None:
                    m = m.model_copy(update={"content": apply_pii(m.content, pii)})
                found = extract_entities(m.content) if entities and m.role != "tool" else None
                rule = m.category or self._rules.categorise(m.role, m.content, None if found is None else bool(found))
                out.append((m, rule, found or []))
            return out

        if sum(len(m.content) for m in messages) <= OFFLOAD_CHARS:
            return run()
        return await asyncio.to_thread(run)

    async def _to_message(self, m: MessageIn, rule: Category, *, classify: bool) -> Message:
        """The stored form of ``m``, whose rule category (or forced one) is ``rule``; ``classify``: ask
        the optional classifier about what the rules call chat."""
        if classify:
            category, retention = await self._categoriser.categorise(m, rule)
        else:
            category = rule
            retention = m.retention if m.retention is not None else default_retention(category, m.role)
        return Message(
            role=m.role, content=m.content, timestamp=m.timestamp if m.timestamp is not None else self._clock(),
            category=category, retention=retention, tool_name=m.tool_name,
            tokens=await self.counter.count(m.content) + MESSAGE_OVERHEAD,
        )

    async def append(self, session: Session, messages: Sequence[MessageIn]) -> list[Message]:
        """Categorise, count and store messages (and their entities and user memory).

        Tool results get no entities: they are not the user's statements and may be stale.
        Contents are stored under the tenant's PII policy (masked unless it is ``allow``). The
        session's entity table keeps at most ``config.max_entities_per_session`` rows, the most
        recently seen (a client sending ever new ids must not grow it without end).
        """
        scanned = await self._scan_messages(messages, entities=True, pii=for_write_back(self._pii_for(session.tenant)))
        stored = [await self._to_message(m, rule, classify=True) for m, rule, _ in scanned]
        return await self._store().append(session, stored, [found for _, _, found in scanned],
                                          max_entities=self.config.max_entities_per_session)

    async def assemble(
        self, session: Session, pending: Sequence[MessageIn], *, context_window: int, reserved_output: int,
        system: str | None = None, mode: ModeName | None = None,
    ) -> ContextResult:
        """Fit the session's history for one request: the block and the window the prompt needs.

        Args:
            session: the session (reloaded here: its summary may have moved on).
            pending: the request's new messages (not stored by this call).
            context_window: the model's context length in tokens.
            reserved_output: tokens kept free for the answer (the request's max_tokens).
            system: the caller's system prompt.
            mode: this request's mode; None = the session's, else the config default.

        Raises:
            ContextBudgetError: the never-drop part does not fit (the ingress answers HTTP 400).
            SessionNotFoundError: the session was deleted or is not the caller's.
        """
        self._check_window(context_window, reserved_output)
        # NOTE: entities are read whatever the mode (the session's mode is only known once read);
        # one store call instead of three matters more than the few rows.
        start = time.perf_counter()
        fresh, history, all_entities = await self._store().snapshot(session.tenant, session.user, session.id)
        requested: ModeName = mode or fresh.mode or self.config.default_mode
        return await self._assemble(session.id, history, all_entities, fresh.summary, pending, requested,
                                    context_window, reserved_output, system, start)

    async def fit(
        self, history: Sequence[MessageIn], pending: Sequence[MessageIn], *, context_window: int,
        reserved_output: int, system: str | None = None, mode: ModeName | None = None,
    ) -> ContextResult:
        """Fit a client-sent history (no server-side session) into the budget with the same rules.

        The messages are categorised by the rules (no model call), their entities extracted, and
        the assembly runs as for a session without a rolling summary: constraints pinned, the
        newest turns verbatim, the rest dropped or (hybrid / retrieval) retrieved by similarity.

        Raises:
            ContextBudgetError: the never-drop part does not fit.
        """
        self._check_window(context_window, reserved_output)
        start = time.perf_counter()
        now = self._clock()
        msgs = []
        scanned = await self._scan_messages(history, entities=True)
        for seq, (m, rule, _) in enumerate(scanned):
            msg = await self._to_message(m, rule, classify=False)
            msgs.append(msg.model_copy(update={"seq": seq, "timestamp": m.timestamp or now}))
        entities = [e for _, _, found in scanned for e in found]
        # NOTE: the newest mention of an entity wins, and the table keeps the most recently seen
        # ``max_entities_per_session``, as in the session store's table.
        latest = {(e.kind, e.value): e for e in entities}
        recency = {key: i for i, key in enumerate((e.kind, e.value) for e in entities)}
        kept = set(sorted(recency, key=recency.__getitem__)[-self.config.max_entities_per_session:])
        table = [e for key, e in latest.items() if key in kept]
        return await self._assemble("", msgs, table, SummaryState(), pending,
                                    mode or self.config.default_mode, context_window, reserved_output, system, start)

    def _check_window(self, context_window: int, reserved_output: int) -> None:
        if context_window <= 0:
            raise ValueError(f"context_window: must be > 0, got {context_window}")
        if not 0 <= reserved_output < context_window:
            raise ValueError(f"reserved_output: must be in [0, context_window={context_window}), got {reserved_output}")

    async def _assemble(
        self, session_id: str, history: list[Message], all_entities: list[Entity], summary: SummaryState,
        pending: Sequence[MessageIn], requested: ModeName, context_window: int, reserved_output: int,
        system: str | None, start: float,
    ) -> ContextResult:
        entities = all_entities if requested in ("summary", "hybrid", "auto") else []
        pending_msgs = [await self._to_message(m, rule, classify=False)
                        for m, rule, _ in await self._scan_messages(pending, entities=False)]
        out = await assemble(
            AssemblyInput(
                history=history, pending=pending_msgs, entities=entities, summary=summary, system=system,
                context_window=context_window, reserved_output=reserved_output, requested=requested,
            ),
            self.config, self.counter, self.embeddings,
        )
        elapsed = time.perf_counter() - start
        CONTEXT_MODE_TOTAL.labels(mode=out.mode, requested=requested).inc()
        CONTEXT_ASSEMBLY_SECONDS.labels(mode=out.mode).observe(elapsed)
        for part, value in out.breakdown.model_dump().items():
            CONTEXT_TOKENS.labels(part=part).observe(value)
        return ContextResult(
            session_id=session_id, block=out.block, window=out.window, mode=out.mode,
            requested_mode=requested, budget=out.budget, breakdown=out.breakdown, signals=out.signals,
            dropped_messages=out.dropped, summary_covers_until=summary.until_seq, latency_ms=elapsed * 1000.0,
        )

    def pii_for(self, tenant: str) -> PiiMode:
        """The PII policy of ``tenant``'s writes (the sessions routes key their lookups by it)."""
        return self._pii_for(tenant)

    def is_refreshing(self, session: Session) -> bool:
        """Whether a summary refresh of ``session`` is running in this process."""
        return (session.tenant, session.id) in self._running

    async def refresh_summary(self, session: Session, *, force: bool = False) -> SummaryState | None:
        """Fold the due messages into the rolling summary; None when not due or already running.

        Runs off the request path: batches of at most ``summary_batch_tokens``, each one call to
        the summariser; the result is stored only if no other refresh stored one meanwhile.
        """
        key = (session.tenant, session.id)
        if key in self._running:
            return None
        self._running.add(key)
        name = self.summariser.name
        try:
            fresh, messages, _ = await self._store().snapshot(session.tenant, session.user, session.id,
                                                           with_entities=False)
            candidates = summary_candidates(fresh, messages, self.config, self._clock(), force=force)
            if not candidates:
                return None
            start = time.perf_counter()
            text = fresh.summary.text
            before = [m for m in messages if m.seq < candidates[0].seq]
            for batch in plan_batches(candidates, self.config):
                lines = render_messages(batch, history=before)
                text = await self.summariser.summarise(text, lines, self.config.summary_max_tokens)
                before.extend(batch)
            # NOTE: the messages were masked when stored; this catches what a summariser model adds.
            text = apply_pii(text, for_write_back(self._pii_for(session.tenant)))
            state = SummaryState(
                text=text, until_seq=candidates[-1].seq, updated_at=self._clock(),
                tokens=await self.counter.count(text), summariser=name,
            )
            saved = await self._store().save_summary(session.tenant, session.user, session.id, state,
                                                     expected_until=fresh.summary.until_seq)
            CONTEXT_SUMMARY_SECONDS.labels(summariser=name).observe(time.perf_counter() - start)
            CONTEXT_SUMMARY_RUNS_TOTAL.labels(summariser=name, outcome="ok" if saved else "superseded").inc()
            return state if saved else None
        except Exception:
            CONTEXT_SUMMARY_RUNS_TOTAL.labels(summariser=name, outcome="error").inc()
            raise
        finally:
            self._running.discard(key)

    def start_summary(self, session: Session, *, force: bool = False) -> asyncio.Task[SummaryState | None]:
        """Schedule :meth:`refresh_summary` on the running loop and return its task (do not await
        it on the request path). The manager keeps a reference until it finishes."""
        task = asyncio.get_running_loop().create_task(self.refresh_summary(session, force=force))
        self._tasks.add(task)
        task.add_done_callback(self._finished)
        return task

    def _finished(self, task: asyncio.Task[SummaryState | None]) -> None:
        self._tasks.discard(task)
        if not task.cancelled() and task.exception() is not None:
            # NOTE: a failed refresh leaves the old summary in place; the next trigger retries.
            _LOG.warning("rolling summary failed: %r", task.exception())
