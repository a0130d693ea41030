"""The chat request pipeline, framework-free: OpenAI request in, OpenAI response out.

Steps of one turn (see ../shared/ARCHITECTURE.md):

1. the turn (:class:`recallserve.serve.turn.Turn`), built once: context-mode fits the history inside the
   token budget (the session's when the request names one in ``metadata.session_id``, else the
   client's messages, by the same rules), the images are described and OCR'd, and memories are
   recalled once (k and threshold from the profile's ``memory`` section);
2. the answer, every prompt rendered from the turn by :func:`recallserve.serve.turn.render_prompt`: through
   the CoT 3.0 agent when one is configured (routes, calls tools and reasons), else one reasoner
   call (plain or segmented);
3. after the answer: the turn is appended to the session, and off the request path the rolling
   summary is refreshed and the exchange is written back to memory (PII masked).

Engines are :class:`~recallserve.serve.engine.LLMEngine` objects: Ray handles wrapped by ``deployments/`` in
the cluster, the real llama.cpp engine in-process in tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass, replace
from typing import Any

from pydantic import Field, ValidationError

from recallserve.kernels import StrictModel
from recallserve.serve.api.chat_protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    ChunkChoice,
    DeltaMessage,
    ImagePart,
    PromptTokensDetails,
    ResponseMessage,
    Usage,
    new_completion_id,
)
from recallserve.serve.api.errors import APIError
from recallserve.serve.api.metrics import TIME_TO_FIRST_TOKEN, TOKENS
from recallserve.serve.agent import Agent, AgentConfig, AgentRequest, AgentResult
from recallserve.serve.api.auth import READ_ONLY_SCOPES
from recallserve.serve.agent.images import analyse_images
from recallserve.serve.context import (
    ContextBudgetError,
    ContextError,
    ContextManager,
    ContextResult,
    MessageIn,
    SessionNotFoundError,
    TokenBreakdown,
)
from recallserve.serve.engine import ChatMessage, EngineError, GenerationParams, LLMEngine, set_engine_affinity
from recallserve.serve.experience import ExperienceService, check_topic
from recallserve.serve.language import fold_width
from recallserve.serve.memory import MemoryBackend, cited_sources
from recallserve.serve.memory_api.admission import SearchAdmissionConfig
from recallserve.serve.pii import PiiMode, apply_pii, for_write_back
from recallserve.serve.traces import TraceRecorder
from recallserve.serve.write_filter import WriteFilterConfig, exchange_write, speaker_name, with_speaker, worth_storing
from recallserve.serve.turn import (
    RecallConfig,
    Turn,
    TurnContext,
    TurnTimings,
    memory_meta,
    prompt_tokens,
    recall_memories,
    recall_query,
    render_prompt,
)

__all__ = ["RequestContext", "PipelineSettings", "ChatPipeline", "Answer", "agent_turn"]

log = logging.getLogger("recallserve.pipeline")
# The request field behind each field of a Session (for a 400 naming what the client sent).
# NOTE: ExperienceMetadata.task_domain's bound (serve/experience/_schema.py).
MAX_DOMAIN_CHARS = 64
_SESSION_FIELDS = {"id": "metadata.session_id", "user": "user", "mode": "metadata.context_mode"}


def _image_error(req: ChatCompletionRequest, error: str) -> APIError:
    """The 400 of the question's first bad image (``analyse_images``' error ``image N: why``), naming
    the part as the client wrote it: ``messages.<m>.content.<p>.image_url.url``."""
    head, _, why = error.partition(": ")
    n = int(head.split()[-1]) if head.startswith("image ") and head.split()[-1].isdigit() else 0
    m = max(i for i, msg in enumerate(req.messages) if msg.role == "user")
    content = req.messages[m].content
    parts = [j for j, part in enumerate(content) if isinstance(part, ImagePart)] if isinstance(content, list) else []
    param = f"messages.{m}.content.{parts[n] if n < len(parts) else 0}.image_url.url"
    why = why.removeprefix("image_url.url: ")
    return APIError(400, f"{param}: {why}", param=param, code="invalid_image")


class RequestContext(StrictModel):
    """Who is asking: the tenant comes from the API key, never from the body."""

    tenant: str = Field(min_length=1, description="Tenant of the API key.")
    user: str = Field(default="default", description="End user within the tenant (the request's `user`).")
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex, description="Id echoed in logs and headers.")
    scopes: list[str] = Field(
        default_factory=lambda: list(READ_ONLY_SCOPES),
        description="Tool permission scopes of the tenant (auth config; least privilege by default).",
    )
    pii: PiiMode = Field(default="mask", description="PII policy of the tenant (auth config `auth.pii`).")
    received_at: float = Field(default_factory=time.time,
                               description="When the request arrived, epoch seconds (an erasure asked after it "
                               "keeps this turn from storing what it produced).")


class PipelineSettings(StrictModel):
    """The chat turn's settings: the ``chat`` section of the app config (one schema, no copies)."""

    model_name: str = Field(default="recallserve", min_length=1, description="Model id clients pass as `model` (GET /v1/models).")
    default_max_tokens: int = Field(default=256, ge=1, le=32768, description="max_tokens when the request gives none.")
    max_request_tokens: int = Field(default=1024, ge=1, le=32768, description="Largest max_tokens a request may ask for.")
    engine_timeout_s: float = Field(
        default=300.0, gt=0, le=3600,
        description="Deadline of a plain or segmented answer (the agent's is agent.request_timeout_s).",
    )
    timeout_grace_s: float = Field(
        default=30.0, ge=1, le=600,
        description="Time the agent gets past its own deadline to return its partial answer before the pipeline's "
        "deadline fires (pipeline deadline = agent.request_timeout_s + this).",
    )
    system_prompt: str = Field(
        default="You are a helpful, precise customer-service and document assistant. Answer concisely.",
        description="System prompt of plain answers (agent off or disabled), placed first: a stable prefix for "
        "the engines' prompt caches.",
    )
    recall: RecallConfig = Field(default_factory=RecallConfig, description="The turn's memory recall.")
    warm_up_wait_s: float = Field(
        default=300.0, ge=0.0, le=3600.0,
        description="Seconds a starting ingress waits for its warm-up (recall path, the agent's prompt prefix in the "
        "reasoner) before it reports ready; past it the warm-up finishes in the background. 0 = do not wait.",
    )
    admission: SearchAdmissionConfig = Field(
        default_factory=SearchAdmissionConfig,
        description="Chat turns one ingress replica runs at once (max_in_flight: what the reasoner runs at once; 0 = no "
        "bound), how many more wait (max_waiting) and for how long (max_wait_s: a turn still without a slot then "
        "could not be served in time and is answered 503 in the API's envelope with Retry-After). Waiters queue per "
        "tenant, round robin (serve.memory_api.admission): a key alone is never refused while it can be served in time.",
    )
    write_back: bool = Field(default=True, description="Store exchanges as memories, off the request path.")
    write_filter: WriteFilterConfig = Field(
        default_factory=WriteFilterConfig,
        description="Which exchanges the write-back stores (default: facts, decisions and outcomes; not greetings "
                    "or questions).",
    )
    agent_overhead_tokens: int = Field(
        default=1200, ge=0, le=32768,
        description="Tokens kept free for the agent's system prompt, tool list and steps when fitting the history.",
    )

    def memory_tokens(self) -> int:
        """Tokens kept free for the recalled memories: ~4 characters a token (cl100k/Qwen on English)."""
        return -(-self.recall.prompt_chars // 4) if self.recall.enabled else 0

    def deadline_s(self, agent: AgentConfig | None) -> float:
        """The pipeline's deadline of one answer: the agent's deadline plus the grace (so the agent's
        partial answer comes back first), else the plain engine deadline."""
        if agent is None:
            return self.engine_timeout_s
        return max(self.engine_timeout_s, agent.request_timeout_s + self.timeout_grace_s)


@dataclass(frozen=True)
class Answer:
    """The answer to one turn, before it is stored and sent.

    Attributes:
        prompt: what the path's reasoner call received before any step was appended (the trace
            stores it; empty when no model was called, e.g. a routing rule's fixed reply).
        agent_result: the agent's run (agent path).
        experience: the stored segmented trace's figures (segmented path).
        engine_model: the model the engine reported (plain path).
    """

    text: str
    finish: str
    prompt_tokens: int
    completion_tokens: int
    prompt: tuple[ChatMessage, ...] = ()
    agent_result: AgentResult | None = None
    experience: dict[str, Any] | None = None
    engine_model: str | None = None
    cached_tokens: int = 0  # of prompt_tokens, reused from the engines' prefix caches


#: ``erased(tenant, user key, since)``: whether an erasure of the user or the tenant was asked at or
#: after ``since`` (``ErasureService.erased_since``).
ErasedCheck = Callable[[str, str, float], Awaitable[bool]]


class ChatPipeline:
    """Answers OpenAI chat requests with the configured engines, memory, context-mode and agent.

    ``erased``: a turn checks it before it stores anything (session append, memory write-back,
    trace): a turn of a user whose erasure was asked while the turn was being answered stores
    nothing, so nothing of it comes back after the erasure is ``done``. The answer is still sent.
    """

    def __init__(self, reasoner: LLMEngine, settings: PipelineSettings | None = None,
                 memory: MemoryBackend | None = None, *, context: ContextManager | None = None,
                 agent: Agent | None = None, experiences: ExperienceService | None = None,
                 traces: TraceRecorder | None = None, erased: ErasedCheck | None = None) -> None:
        self.reasoner = reasoner
        # NOTE: (tenant, user key, since) -> was the user (or tenant) asked to be erased since? (issue 41)
        self.erased = erased
        self.traces = traces
        self.experiences = experiences
        self.settings = settings or PipelineSettings()
        self.memory = memory
        # NOTE: without a session store the context manager still fits client-sent histories.
        self.context = context if context is not None else ContextManager(None)
        self.agent = agent
        self._background: set[asyncio.Task[Any]] = set()

    def models(self) -> list[str]:
        """Model names this pipeline answers to."""
        return [self.settings.model_name]

    def deadline_s(self, req: ChatCompletionRequest | None = None) -> float:
        """Seconds one answer may take (see :meth:`PipelineSettings.deadline_s`)."""
        use_agent = self.agent is not None and (req is None or self._use_agent(req))
        return self.settings.deadline_s(self.agent.config if use_agent and self.agent is not None else None)

    # ---- request checks ------------------------------------------------------------------
    def _check_model(self, req: ChatCompletionRequest) -> None:
        if req.model not in self.models():
            raise APIError(404, f"model: unknown model {req.model!r}; available: {', '.join(self.models())}",
                           param="model", code="model_not_found")

    def _params(self, req: ChatCompletionRequest) -> GenerationParams:
        max_tokens = req.requested_max_tokens() or self.settings.default_max_tokens
        if max_tokens > self.settings.max_request_tokens:
            name = req.max_tokens_param()
            raise APIError(400, f"{name}: {max_tokens} is above this server's limit of "
                           f"{self.settings.max_request_tokens}", param=name)
        schema = None
        if req.response_format is not None and req.response_format.type == "json_schema":
            spec = req.response_format.json_schema
            schema = spec.schema_ if spec is not None else None
            if schema is None:
                raise APIError(400, "response_format.json_schema.schema: a JSON schema object is required",
                               param="response_format.json_schema.schema")
        elif req.response_format is not None and req.response_format.type == "json_object":
            schema = {"type": "object"}
        return GenerationParams(
            max_tokens=max_tokens,
            temperature=0.2 if req.temperature is None else req.temperature,
            top_p=0.95 if req.top_p is None else req.top_p,
            stop=req.stop_list(),
            seed=req.seed,
            json_schema=schema,
            **req.penalties(),
        )

    def _segmented(self, req: ChatCompletionRequest) -> bool:
        """Segmented (E-CoT) reasoning: asked with ``metadata.reasoning=segmented``, or by default for
        a ``metadata.task_domain`` in ``experience.domains`` (``reasoning=default``, ``stop``, a JSON ``response_format`` opt out)."""
        meta = req.metadata or {}
        reasoning = meta.get("reasoning")
        wanted = reasoning == "segmented" or (
            reasoning is None and self.experiences is not None and not req.constrains_output()
            and meta.get("task_domain") in self.experiences.config.domains)
        if wanted and self.experiences is None:
            raise APIError(400, "metadata.reasoning: segmented reasoning needs the experience memory, which this "
                           "server does not run", param="metadata.reasoning")
        return wanted

    def _check_filing(self, req: ChatCompletionRequest, ctx: RequestContext) -> None:
        """A segmented turn's ``metadata.topic`` and ``task_domain`` are checked before the turn, as
        the experience record will hold them (after the tenant's masking): a bad one was a 500 from
        the record's own validation after the model had answered."""
        meta = req.metadata or {}
        if not self._segmented(req):
            return
        topic, domain = meta.get("topic"), meta.get("task_domain")
        if topic is not None:
            try:
                check_topic(apply_pii(topic, for_write_back(ctx.pii)))
            except ValueError as exc:
                held = " (it holds personal data)" if apply_pii(topic, "mask") != topic else ""
                raise APIError(400, f"metadata.topic: {exc}{held}", param="metadata.topic") from None
        if domain is not None and not 1 <= len(apply_pii(domain, for_write_back(ctx.pii))) <= MAX_DOMAIN_CHARS:
            raise APIError(400, f"metadata.task_domain: 1-{MAX_DOMAIN_CHARS} characters", param="metadata.task_domain")

    def _render(self, turn: Turn, head: str, question: str | None = None) -> list[ChatMessage]:
        return render_prompt(turn, head, self.settings.recall, question=question)

    async def _produce(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn) -> Answer:
        """E-CoT: a segmented trace (context / reasoning / verification / outcome), checked by code
        and stored; experiences of the same model family are injected into the prompt, which is the
        turn rendered under the segmented format."""
        assert self.experiences is not None
        meta = req.metadata or {}
        prompts: list[list[ChatMessage]] = []

        def render(head: str, text: str) -> list[ChatMessage]:
            prompts.append(self._render(turn, head, text))  # NOTE: kept for the trace: the last one was sent
            return prompts[-1]

        result = await self.experiences.produce(ctx.tenant, self.reasoner, turn.asked,
                                                domain=meta.get("task_domain", "general"),
                                                topic=meta.get("topic", "general"), prompt=render, user=ctx.user,
                                                may_store=lambda: self._may_store(ctx))
        exp = result.experience
        experience = {
            "id": exp.record.metadata.id if exp is not None else None,
            "tier": exp.tier if exp is not None else None,
            "confidence": exp.record.outcome.confidence if exp is not None else None,
            "injected": result.injected, "required_checks": result.required_checks,
            "archival": result.archival,
            # NOTE: the trace's own tags (its failed checks), as stored; the archive's query tags apart.
            "error_tags": list(exp.record.evaluation.error_tags) if exp is not None else [],
            "searched_tags": result.searched_tags,
            "parsed": result.answer is not None, "rewritten": result.first_report is not None,
        }
        return Answer(result.answer or result.raw_text, "stop", result.prompt_tokens, result.completion_tokens,
                      prompt=tuple(prompts[-1]) if prompts else (), experience=experience)

    def _head(self, req: ChatCompletionRequest) -> str | None:
        """The fixed instructions of the request's path: the segmented format, the plain system
        prompt, or None for the agent (whose head, protocol + tools, is its own and is reserved as
        ``agent_overhead_tokens``)."""
        if self._segmented(req):
            assert self.experiences is not None
            return self.experiences.system_prompt()
        return None if self._use_agent(req) else self.settings.system_prompt

    def _use_agent(self, req: ChatCompletionRequest) -> bool:
        # NOTE: a response_format constraint or stop sequences are the client's own protocol; the agent's
        # JSON steps would fight them, so such requests go straight to the reasoner.
        if self.agent is None and (req.metadata or {}).get("agent") == "on":  # NOTE: it was a plain answer, in silence
            raise APIError(400, "metadata.agent: 'on' needs the agent loop, which this server does not run", param="metadata.agent")
        return self.agent is not None and not req.constrains_output()

    # ---- step 1: the turn ------------------------------------------------------------------
    async def _build_turn(self, req: ChatCompletionRequest, ctx: RequestContext, params: GenerationParams) -> Turn:
        """The request as one frozen :class:`~recallserve.serve.turn.Turn`: the client's system prompt, the
        history the token budget keeps (the session's, else the client's messages, by the same rules),
        the context-mode block, the question and its analysed images, and the turn's one memory recall;
        then the budget is checked on the tokens of the prompt the engine receives."""
        started = time.perf_counter()
        instructions = "\n\n".join(m.text().strip() for m in req.messages
                                    if m.role in ("system", "developer") and m.text().strip())
        convo = [m for m in req.messages if m.role not in ("system", "developer")]
        ask = max((i for i, m in enumerate(convo) if m.role == "user"), default=None)
        if ask is None:
            raise APIError(400, "messages: at least one message with role 'user' is required", param="messages")
        # NOTE: ids typed full-width (a Chinese input method: "１０４４２４") are the same ids to every rule and tool.
        question, image_urls = fold_width(convo[ask].text()), tuple(convo[ask].images())
        # NOTE: the question's images first, before any session is opened or written: a bad one (a
        # remote URL, not base64, not an image) is the client's error, a 400 naming its part, never
        # dropped from the prompt in silence (the plain and streaming paths have no step to report it).
        t = time.perf_counter()
        images, image_errors = await analyse_images(image_urls, question,
                                                    describer=self.agent.describer if self.agent is not None else None)
        images_ms = round((time.perf_counter() - t) * 1e3, 2)
        if image_errors:
            raise _image_error(req, image_errors[0])
        # NOTE: an empty message adds nothing to the history: skipped rather than stored empty.
        texts = [(i, m, m.history_text() or ("[image attached]" if m.images() else "")) for i, m in enumerate(convo)]
        msgs_in = {i: MessageIn(role=m.role, content=t) for i, m, t in texts if t}  # type: ignore[arg-type]
        head = self._head(req)
        use_agent = head is None
        system = "\n\n".join(p for p in (head, instructions) if p) or None
        # NOTE: no memory tier, no recalled memories to make room for.
        memory_tokens = self.settings.memory_tokens() if self.memory is not None else 0
        reserved = params.max_tokens + memory_tokens + (self.settings.agent_overhead_tokens if use_agent else 0)
        window = self.reasoner.context_window
        if reserved >= window:
            name = req.max_tokens_param()
            raise APIError(400, f"{name}: {params.max_tokens} leaves no room in the {window}-token context "
                           f"(with {reserved - params.max_tokens} tokens kept for the prompt's fixed parts)",
                           param=name)
        meta = req.metadata or {}
        session_id, mode = meta.get("session_id"), meta.get("context_mode")
        session = None
        if session_id:
            try:
                session = await self.context.open_session(ctx.tenant, ctx.user, session_id)
            except Exception as exc:  # noqa: BLE001 - mapped to the client's 4xx, or raised unchanged
                raise self._context_error(exc, session_id) from None

        async def fit(reserve: int) -> tuple[ContextResult, list[MessageIn], list[ChatMessage]]:
            try:
                if session is not None:
                    pending = list(msgs_in.values())
                    result = await self.context.assemble(session, pending, context_window=window,
                                                         reserved_output=reserve, system=system, mode=mode)  # type: ignore[arg-type]
                    earlier = [ChatMessage(role=m.role, content=m.content) for i, m in msgs_in.items() if i != ask]
                else:
                    pending = [msgs_in[ask]] if ask in msgs_in else []
                    result = await self.context.fit([m for i, m in msgs_in.items() if i < ask], pending,
                                                    context_window=window, reserved_output=reserve, system=system,
                                                    mode=mode)  # type: ignore[arg-type]
                    # NOTE: messages after the question (a client echo) stay after the kept history.
                    earlier = [ChatMessage(role=m.role, content=m.content) for i, m in msgs_in.items() if i > ask]
            except Exception as exc:  # noqa: BLE001 - mapped to the client's 4xx, or raised unchanged
                raise self._context_error(exc, session_id) from None
            return result, pending, earlier

        result, pending, earlier = await fit(reserved)
        t = time.perf_counter()
        uncached = await self._recently_erased(ctx)
        cache = self.agent.cache if self.agent is not None and not uncached else None
        memories, memory_error = await recall_memories(
            self.memory, ctx.tenant, recall_query(question, images), self.settings.recall, cache, user=ctx.user)
        recall_ms = round((time.perf_counter() - t) * 1e3, 2)

        def make(result: ContextResult, pending: list[MessageIn], earlier: list[ChatMessage]) -> Turn:
            return Turn(question=question, instructions=instructions, context=result.block,
                        history=(*result.window, *earlier), image_urls=image_urls, images=tuple(images),
                        memories=tuple(memories), memory_error=memory_error, session=session,
                        pending=tuple(pending), timings=TurnTimings(images_ms=images_ms, recall_ms=recall_ms),
                        started=started, uncached=uncached)

        # NOTE: the budget is checked on the prompt the engine receives (the path's first reasoner
        # call, rendered), not on context-mode's estimate: the reserve above (memories at ~4
        # characters a token, agent_overhead_tokens for the agent's head) is a guess made before the
        # memories were recalled. When the rendered prompt overruns, the history is fitted once more
        # with the measured rest of the prompt as the reserve:
        #     reserve = max_tokens + (rendered tokens - context-mode's own share of them)
        # and a prompt that still overruns is the client's 400.
        turn = make(result, pending, earlier)
        used = await prompt_tokens(self.first_prompt(req, ctx, turn), self.context.counter)
        if used + params.max_tokens > window:
            measured = params.max_tokens + max(0, used - result.breakdown.total)
            if measured < window:
                result, pending, earlier = await fit(measured)
                turn = make(result, pending, earlier)
                used = await prompt_tokens(self.first_prompt(req, ctx, turn), self.context.counter)
        if used + params.max_tokens > window:
            name = req.max_tokens_param()
            raise APIError(400, f"messages: the prompt ({used} tokens) and {name} ({params.max_tokens}) exceed the "
                           f"{window}-token context: shorten the messages or lower {name}", param="messages",
                           code="context_budget_exceeded")
        parts = result.breakdown.model_dump(exclude={"system", "total"})
        breakdown = TokenBreakdown(system=max(0, used - sum(parts.values())), total=used, **parts)
        report = TurnContext(session_id=session.id if session is not None else None, mode=result.mode,
                             requested_mode=result.requested_mode, budget=result.budget, breakdown=breakdown,
                             dropped_messages=result.dropped_messages, latency_ms=round(result.latency_ms, 2))
        return replace(turn, report=report)

    def _context_error(self, exc: Exception, session_id: str | None) -> Exception:
        """The client's error for what context-mode raised while building a turn (``exc`` itself when
        it is not the client's)."""
        if isinstance(exc, SessionNotFoundError):
            return APIError(404, f"metadata.session_id: {exc}", type="not_found_error", param="metadata.session_id")
        if isinstance(exc, ValidationError):
            # NOTE: what the request schema lets through but a session cannot hold (a session id or
            # user over 128 characters, an unknown context mode): the field by its request name.
            err = exc.errors()[0]
            param = _SESSION_FIELDS.get(str(err["loc"][0]) if err["loc"] else "", "metadata")
            return APIError(400, f"{param}: {err['msg']} (sessions)", param=param)
        if isinstance(exc, ContextBudgetError):
            return APIError(400, f"messages: {exc}", param="messages", code="context_budget_exceeded")
        if isinstance(exc, ContextError):
            # NOTE: no session store (sessions off), or a mode this server cannot run (retrieval
            # without an embedder).
            param = "metadata.session_id" if session_id and self.context.store is None else "metadata.context_mode"
            return APIError(400, f"{param}: {exc}", param=param)
        return exc

    def _metadata(self, ctx: RequestContext, turn: Turn, answer: Answer) -> dict[str, Any]:
        """The response's ``recallserve`` field: the request id, what context-mode did, the recalled
        memories, and what the answer's path adds (the agent's trace, the experience, the engine's model)."""
        meta: dict[str, Any] = {"request_id": ctx.request_id}
        if turn.report is not None:
            meta["context"] = turn.report.model_dump(mode="json")
        meta.update(memory_meta(turn.memories, turn.memory_error))
        if answer.experience is not None:
            meta["experience"] = answer.experience
        if answer.agent_result is not None:
            meta["agent"] = answer.agent_result.metadata()
        if answer.engine_model is not None:
            meta["engine_model"] = answer.engine_model
        return meta

    # ---- step 2b: the agent ----------------------------------------------------------------------
    def _agent_request(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn) -> AgentRequest:
        mode = "off" if req.tool_choice == "none" else (req.metadata or {}).get("agent", "auto")  # NOTE: "none": no tool runs
        session_id = turn.session.id if turn.session is not None else (req.metadata or {}).get("session_id")
        return AgentRequest(tenant=ctx.tenant, user=ctx.user, scopes=list(ctx.scopes), mode=mode,  # type: ignore[arg-type]
                            session_id=session_id, max_answer_tokens=req.requested_max_tokens(), pii=ctx.pii,
                            temperature=req.temperature, top_p=req.top_p, seed=req.seed, **req.penalties())

    @staticmethod
    def _agent_answer(result: AgentResult) -> Answer:
        return Answer(result.answer, result.openai_finish(), result.usage.prompt_tokens, result.usage.completion_tokens,
                      prompt=tuple(result.prompt), agent_result=result, cached_tokens=result.usage.cached_tokens)

    # ---- step 3: after the answer ------------------------------------------------------------------
    def _background_task(self, coro: Awaitable[Any], what: str, ctx: RequestContext) -> None:
        async def run() -> None:
            try:
                await coro
            except Exception as exc:  # noqa: BLE001 - logged; the answer was already sent
                log.warning("request %s: %s failed: %s", ctx.request_id, what, exc)

        task = asyncio.get_running_loop().create_task(run())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    async def _finish_turn(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn, answer: str,
                           agent_result: AgentResult | None) -> None:
        """Append the turn to its session (on the request path: the next turn must see it), then
        schedule the rolling summary and the memory write-back off the request path; nothing when
        the user was asked to be erased since the request arrived."""
        if await self._erased(ctx):
            return
        if self.context is not None and turn.session is not None and answer.strip():
            await self.context.append(turn.session, [*turn.pending, MessageIn(role="assistant", content=answer)])
            self.context.start_summary(turn.session)
        if not self.settings.write_back or self.memory is None or not answer.strip():
            return
        kept = worth_storing(turn.question, answer, self.settings.write_filter)
        pii = for_write_back(ctx.pii)
        speaker = speaker_name(req.messages, pii)
        if agent_result is not None and self.agent is not None:
            # NOTE: the agent's exchange write is its one "message"; image units stay (their own kind).
            writes = with_speaker([w.model_copy(update={"user": ctx.user}) for w in agent_result.memory_writes
                                   if kept is not None or w.kind != "message"], speaker)
            agent_result = agent_result.model_copy(update={"memory_writes": writes})
            agent, result = self.agent, agent_result
            self._background_task(self._unless_erased(ctx, lambda: agent.write_back(ctx.tenant, result)),
                                  "memory write-back", ctx)
            return
        if kept is None:
            return
        item = exchange_write(kept, speaker=speaker, user=ctx.user, request_id=ctx.request_id,
                              session=(req.metadata or {}).get("session_id", ""), pii=pii,
                              cites=cited_sources(answer, turn.memories))
        memory = self.memory
        self._background_task(self._unless_erased(ctx, lambda: memory.write(ctx.tenant, [item])),
                              "memory write-back", ctx)

    async def _recently_erased(self, ctx: RequestContext) -> bool:
        """Whether this turn must bypass the recall and tool caches: its user (or the tenant) was asked
        to be erased at or after ``now - 2 x ttl`` (``ttl``: the agent cache's ``cache_ttl_s``).

        Why 2 x ttl: an entry alive now was stored at ``s >= now - ttl``; it may hold erased rows when an
        erasure was asked before ``s`` and had not finished by then. Erasures asked at ``s - ttl`` or later
        are covered, so any run shorter than the cache's lifetime is (the runs take seconds). The
        erasure log is shared by every ingress replica, so a replica that did not run the erasure (and
        whose cache was not cleared by it) stops serving what it cached. One log read per turn, only
        where a cache and an erasure check are configured; when the log cannot be read the turn still
        answers, without the caches (it cannot tell that nothing was erased).
        """
        if self.erased is None or self.agent is None or self.agent.cache.ttl_s <= 0:
            return False
        try:
            return await self.erased(ctx.tenant, ctx.user, time.time() - 2 * self.agent.cache.ttl_s)
        except Exception as exc:  # noqa: BLE001 - the log unreachable: answer, from no cache
            log.warning("request %s: erasure log unreachable (%s); the turn uses no cache", ctx.request_id,
                        type(exc).__name__)
            return True

    async def _may_store(self, ctx: RequestContext) -> bool:
        """The segmented trace's gate (``ExperienceService.produce(may_store=...)``): not when the
        user was asked to be erased since the request arrived."""
        return not await self._erased(ctx)

    async def _erased(self, ctx: RequestContext) -> bool:
        """Whether the user was asked to be erased since the request arrived (nothing of the turn is
        stored then). A log that cannot be read counts as no: the turn is answered and stored as
        without the check (the log lives in the state database the stores write to, so that store
        usually fails too); a warning names the request."""
        if self.erased is None:
            return False
        try:
            erased = await self.erased(ctx.tenant, ctx.user, ctx.received_at)
        except Exception as exc:  # noqa: BLE001 - the log unreachable: the turn is answered as usual
            log.warning("request %s: erasure log unreachable (%s)", ctx.request_id, type(exc).__name__)
            return False
        if erased:
            log.info("request %s: the user was asked to be erased during the turn; nothing of it is stored",
                     ctx.request_id)
            return True
        return False

    async def _unless_erased(self, ctx: RequestContext, store: Callable[[], Awaitable[Any]]) -> None:
        """``store()`` unless an erasure was asked since the request arrived (checked just before it)."""
        if not await self._erased(ctx):
            await store()

    def _record_trace(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn, answer: Answer) -> None:
        """Store the turn's trace off the request path: route, steps, tool calls, memories, and the
        prompt the path's reasoner call received (``answer.prompt``; empty when no model was called,
        e.g. a routing rule's fixed reply)."""
        if self.traces is None or not self.traces.config.enabled:
            return
        path = "segmented" if self._segmented(req) else "agent" if self._use_agent(req) else "plain"
        meta = answer.agent_result.metadata() if answer.agent_result is not None else None
        traces = self.traces
        self._background_task(self._unless_erased(ctx, lambda: traces.record(
            ctx.tenant, turn, request_id=ctx.request_id, user=ctx.user, path=path, stream=bool(req.stream),
            answer=answer.text, finish=answer.finish, prompt_tokens=answer.prompt_tokens,
            completion_tokens=answer.completion_tokens, prompt=list(answer.prompt), agent_meta=meta,
            experience=answer.experience, started=turn.started)),
            "turn trace", ctx)

    # ---- non-streaming ------------------------------------------------------------------------------
    async def complete(self, req: ChatCompletionRequest, ctx: RequestContext) -> ChatCompletionResponse:
        """Answer a non-streaming request."""
        turn, params = await self.build_turn(req, ctx)
        answer = await self.answer(req, ctx, turn, params)
        TOKENS.labels("reasoner", "prompt").inc(answer.prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(answer.completion_tokens)
        TOKENS.labels("reasoner", "prompt_cached").inc(answer.cached_tokens)
        await self._finish_turn(req, ctx, turn, answer.text, answer.agent_result)
        self._record_trace(req, ctx, turn, answer)
        return ChatCompletionResponse(
            model=req.model,
            choices=[Choice(message=ResponseMessage(content=answer.text), finish_reason=answer.finish)],  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                        total_tokens=answer.prompt_tokens + answer.completion_tokens,
                        prompt_tokens_details=PromptTokensDetails(cached_tokens=answer.cached_tokens)),
            recallserve=self._metadata(ctx, turn, answer),
        )

    async def build_turn(self, req: ChatCompletionRequest, ctx: RequestContext) -> tuple[Turn, GenerationParams]:
        """Check the request and build its turn (nothing is stored): step 1 of :meth:`complete`."""
        self._check_model(req)
        params = self._params(req)
        self._check_filing(req, ctx)
        set_engine_affinity(ctx.tenant, (req.metadata or {}).get("session_id") or req.user)
        return await self._build_turn(req, ctx, params), params

    def first_prompt(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn) -> list[ChatMessage]:
        """The prompt of the path's first reasoner call for ``turn``, without calling the engine: the
        agent's (:meth:`~recallserve.serve.agent.Agent.first_prompt`), the segmented prompt, or the plain
        one. The turn's budget is checked on it; ``recallserve eval retention`` scores it."""
        head = self._head(req)
        if head is None:
            assert self.agent is not None
            return self.agent.first_prompt(turn, self._agent_request(req, ctx, turn))
        return self._render(turn, head, f"Problem: {turn.asked}" if self._segmented(req) else None)

    async def answer(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn,
                     params: GenerationParams) -> Answer:
        """Step 2 of :meth:`complete`: the path's answer to ``turn`` within the pipeline's deadline
        (the turn is not stored; :meth:`complete` does that)."""
        deadline = self.deadline_s(req)
        try:
            async with asyncio.timeout(deadline):
                if self._segmented(req):
                    return await self._produce(req, ctx, turn)
                if self._use_agent(req):
                    assert self.agent is not None
                    return self._agent_answer(await self.agent.run(self._agent_request(req, ctx, turn), turn))
                prompt = self._render(turn, self.settings.system_prompt)
                out = await self.reasoner.chat(prompt, params)
                return Answer(out.text, out.finish_reason, out.prompt_tokens, out.completion_tokens,
                              prompt=tuple(prompt), engine_model=out.model, cached_tokens=out.cached_tokens)
        except TimeoutError as exc:
            raise TimeoutError(f"no answer within {deadline:.0f} s") from exc

    # ---- streaming ----------------------------------------------------------------------------------
    async def stream(self, req: ChatCompletionRequest, ctx: RequestContext) -> AsyncIterator[ChatCompletionChunk]:
        """Answer a streaming request chunk by chunk (validation happens before the first chunk)."""
        turn, params = await self.build_turn(req, ctx)
        if self._segmented(req):
            return self._stream_segmented(req, ctx, turn)
        if self._use_agent(req):
            return self._stream_agent(req, ctx, turn)
        return self._stream_engine(req, ctx, turn, self._render(turn, self.settings.system_prompt), params)

    def _chunk(self, req: ChatCompletionRequest, cid: str, created: int, **kw: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=cid, created=created, model=req.model, **kw)

    async def _tail(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn, cid: str, created: int,
                    answer: Answer) -> AsyncIterator[ChatCompletionChunk]:
        TOKENS.labels("reasoner", "prompt").inc(answer.prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(answer.completion_tokens)
        await self._finish_turn(req, ctx, turn, answer.text, answer.agent_result)
        self._record_trace(req, ctx, turn, answer)
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(), finish_reason=answer.finish)],  # type: ignore[arg-type]
                          recallserve=self._metadata(ctx, turn, answer))
        if req.stream_options and req.stream_options.include_usage:
            yield self._chunk(req, cid, created, choices=[],
                              usage=Usage(prompt_tokens=answer.prompt_tokens, completion_tokens=answer.completion_tokens,
                                          total_tokens=answer.prompt_tokens + answer.completion_tokens))

    async def _stream_engine(self, req: ChatCompletionRequest, ctx: RequestContext, turn: Turn,
                             messages: list[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatCompletionChunk]:
        cid, created, start = new_completion_id(), int(time.time()), time.perf_counter()
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])
        seconds = self.deadline_s(req)
        deadline = start + seconds
        answer: list[str] = []
        finish, prompt_tokens, completion_tokens = "stop", 0, 0
        agen = self.reasoner.stream(messages, params)
        try:
            while True:
                try:
                    async with asyncio.timeout(max(0.0, deadline - time.perf_counter())):
                        delta = await anext(agen)
                except StopAsyncIteration:
                    break
                except TimeoutError as exc:
                    raise EngineError(f"reasoner stream exceeded {seconds:.0f} s") from exc
                if delta.text:
                    if not answer:
                        TIME_TO_FIRST_TOKEN.observe(time.perf_counter() - start)
                    answer.append(delta.text)
                    yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(content=delta.text))])
                if delta.finish_reason is not None:
                    finish = delta.finish_reason
                    prompt_tokens, completion_tokens = delta.prompt_tokens or 0, delta.completion_tokens or 0
        finally:
            await agen.aclose()
        done = Answer("".join(answer), finish, prompt_tokens, completion_tokens, prompt=tuple(messages))
        async for chunk in self._tail(req, ctx, turn, cid, created, done):
            yield chunk

    async def _stream_segmented(self, req: ChatCompletionRequest, ctx: RequestContext,
                                turn: Turn) -> AsyncIterator[ChatCompletionChunk]:
        # NOTE: the answer is only known once the whole trace is parsed and verified, so it is
        # sent as one piece.
        cid, created = new_completion_id(), int(time.time())
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])
        seconds = self.deadline_s(req)
        try:
            async with asyncio.timeout(seconds):
                produced = await self._produce(req, ctx, turn)
        except TimeoutError as exc:
            raise EngineError(f"segmented reasoning exceeded {seconds:.0f} s") from exc
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(content=produced.text))])
        async for chunk in self._tail(req, ctx, turn, cid, created, produced):
            yield chunk

    async def _stream_agent(self, req: ChatCompletionRequest, ctx: RequestContext,
                            turn: Turn) -> AsyncIterator[ChatCompletionChunk]:
        assert self.agent is not None
        cid, created, start = new_completion_id(), int(time.time()), time.perf_counter()
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])
        result: AgentResult | None = None
        sent = False
        agen = self.agent.stream(self._agent_request(req, ctx, turn), turn)
        seconds = self.deadline_s(req)
        try:
            async with asyncio.timeout(seconds):
                async for event in agen:
                    if event.type == "answer_delta" and event.text:
                        if not sent:
                            TIME_TO_FIRST_TOKEN.observe(time.perf_counter() - start)
                            sent = True
                        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(content=event.text))])
                    elif event.type == "done":
                        result = event.result
        except TimeoutError as exc:
            raise EngineError(f"agent exceeded {seconds:.0f} s") from exc
        finally:
            await agen.aclose()
        if result is None:
            raise EngineError("agent stream ended without a result")
        if not sent and result.answer:
            yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(content=result.answer))])
        async for chunk in self._tail(req, ctx, turn, cid, created, self._agent_answer(result)):
            yield chunk


async def agent_turn(agent: Agent, messages: list[dict[str, Any]], *, tenant: str, scopes: list[str],
                     mode: str = "auto", max_tokens: int | None = None) -> tuple[AgentRequest, Turn]:
    """The agent's request and turn for OpenAI ``messages``, built exactly as for ``POST /v1/chat/completions``
    (:meth:`ChatPipeline.build_turn`: budget, context-mode, images, the one recall), for callers that
    run the agent in-process (``recallserve eval agent``, ``recallserve demo``, the agent's tests).

    Example:
        >>> request, turn = await agent_turn(agent, [{"role": "user", "content": "2+2?"}], tenant="t1",
        ...                                  scopes=["basic"])  # doctest: +SKIP
        >>> result = await agent.run(request, turn)  # doctest: +SKIP
    """
    pipeline = ChatPipeline(agent.reasoner, PipelineSettings(recall=agent.recall, write_back=False),
                            memory=agent.memory, agent=agent)
    body: dict[str, Any] = {"model": pipeline.settings.model_name, "messages": messages, "metadata": {"agent": mode}}
    if max_tokens is not None:
        body["max_tokens"] = max_tokens
    req = ChatCompletionRequest.model_validate(body)
    ctx = RequestContext(tenant=tenant, scopes=scopes)
    turn, _ = await pipeline.build_turn(req, ctx)
    return pipeline._agent_request(req, ctx, turn), turn
