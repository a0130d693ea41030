"""The chat request pipeline, framework-free: OpenAI request in, OpenAI response out.

Steps of one turn (see ../shared/ARCHITECTURE.md):

1. context-mode, when the request names a session (``metadata.session_id``): the session's
   history, summary and entities are assembled inside the token budget with the chosen mode;
2. memory recall and the answer: through the CoT 3.0 agent when one is configured (it recalls,
   routes, calls tools and reasons), else recall + one reasoner call;
3. after the answer: the turn is appended to the session, and off the request path the rolling
   summary is refreshed and the exchange is written back to memory (PII masked).

Engines are :class:`~serve.engine.LLMEngine` objects: Ray handles wrapped by ``deployments/`` in
the cluster, the real llama.cpp engine in-process in tests.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator, Awaitable
from dataclasses import dataclass, field
from typing import Any

from pydantic import Field, ValidationError

from serve._base import StrictModel
from serve.api.chat_protocol import (
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChatCompletionResponse,
    Choice,
    ChunkChoice,
    DeltaMessage,
    ResponseMessage,
    Usage,
    new_completion_id,
)
from serve.api.errors import APIError
from serve.api.metrics import TIME_TO_FIRST_TOKEN, TOKENS
from serve._turn import engine_role, last_user_images, last_user_text, memory_message, memory_meta
from serve.agent import Agent, AgentMessage, AgentRequest, AgentResult
from serve.agent.guards import mask_pii
from serve.context import ContextBudgetError, ContextManager, MessageIn, Session, SessionNotFoundError
from serve.engine import ChatMessage, EngineError, GenerationParams, LLMEngine
from serve.experience import ExperienceService, ProduceResult
from serve.memory import MemoryBackend, MemoryHit, MemoryWrite

__all__ = ["RequestContext", "PipelineSettings", "ChatPipeline"]

log = logging.getLogger("recallserve.pipeline")
# The request field behind each field of a Session (for a 400 naming what the client sent).
_SESSION_FIELDS = {"id": "metadata.session_id", "user": "user", "mode": "metadata.context_mode"}


class RequestContext(StrictModel):
    """Who is asking: the tenant comes from the API key, never from the body."""

    tenant: str = Field(min_length=1, description="Tenant of the API key.")
    user: str = Field(default="default", description="End user within the tenant (the request's `user`).")
    request_id: str = Field(default_factory=lambda: uuid.uuid4().hex, description="Id echoed in logs and headers.")


class PipelineSettings(StrictModel):
    """Knobs of the pipeline that are not engine or deployment settings."""

    model_name: str = Field(default="recallserve", min_length=1, description="Name served on /v1/models.")
    default_max_tokens: int = Field(default=256, ge=1, le=32768, description="max_tokens when the request gives none.")
    max_request_tokens: int = Field(default=1024, ge=1, le=32768, description="Largest max_tokens a request may ask for.")
    engine_timeout_s: float = Field(default=300.0, gt=0, le=3600, description="Deadline of one engine call.")
    system_prompt: str = Field(
        default="You are a helpful, precise customer-service and document assistant. Answer concisely.",
        description="System prompt placed first (a stable prefix for the engines' prompt caches).",
    )
    memory_top_k: int = Field(default=16, ge=0, le=1000, description="Memories recalled per turn (0 disables recall).")
    memory_threshold: float = Field(default=0.35, ge=-1, le=1, description="Cosine threshold of recall.")
    memory_prompt_chars: int = Field(
        default=3000, ge=0, le=100_000, description="Most characters of recalled memories put in the prompt."
    )
    memory_timeout_s: float = Field(default=10.0, gt=0, le=600, description="Deadline of the recall step.")
    write_back: bool = Field(default=True, description="Store each exchange as a memory, off the request path.")
    agent_overhead_tokens: int = Field(
        default=1200, ge=0, le=32768,
        description="Tokens kept free for the agent's system prompt, tool list and steps when assembling context.",
    )
    scopes: list[str] = Field(
        default_factory=lambda: ["basic", "memory:read", "orders:read", "tickets:read", "inventory:read"],
        description="Tool permission scopes every tenant gets (least privilege: no write scopes by default).",
    )


@dataclass
class _Turn:
    """What one request carries between its steps."""

    messages: list[ChatMessage]
    session: Session | None = None
    pending: list[MessageIn] = field(default_factory=list)
    meta: dict[str, Any] = field(default_factory=dict)


class ChatPipeline:
    """Answers OpenAI chat requests with the configured engines, memory, context-mode and agent."""

    def __init__(self, reasoner: LLMEngine, settings: PipelineSettings | None = None,
                 memory: MemoryBackend | None = None, *, context: ContextManager | None = None,
                 agent: Agent | None = None, experiences: ExperienceService | None = None) -> None:
        self.reasoner = reasoner
        self.experiences = experiences
        self.settings = settings or PipelineSettings()
        self.memory = memory
        self.context = context
        self.agent = agent
        self._background: set[asyncio.Task[Any]] = set()

    def models(self) -> list[str]:
        """Model names this pipeline answers to."""
        return [self.settings.model_name]

    # ---- request checks ------------------------------------------------------------------
    def _check_model(self, req: ChatCompletionRequest) -> None:
        if req.model not in self.models():
            raise APIError(404, f"model: unknown model {req.model!r}; available: {', '.join(self.models())}",
                           param="model", code="model_not_found")

    def _params(self, req: ChatCompletionRequest) -> GenerationParams:
        max_tokens = req.requested_max_tokens() or self.settings.default_max_tokens
        if max_tokens > self.settings.max_request_tokens:
            raise APIError(400, f"max_tokens: {max_tokens} is above this server's limit of "
                           f"{self.settings.max_request_tokens}", param="max_tokens")
        schema = None
        if req.response_format is not None and req.response_format.type == "json_schema":
            spec = req.response_format.json_schema or {}
            schema = spec.get("schema")
            if not isinstance(schema, dict):
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
        )

    def _segmented(self, req: ChatCompletionRequest) -> bool:
        wanted = (req.metadata or {}).get("reasoning") == "segmented"
        if wanted and self.experiences is None:
            raise APIError(400, "metadata.reasoning: segmented reasoning needs the experience memory, which this "
                           "server does not run", param="metadata.reasoning")
        return wanted

    async def _produce(self, req: ChatCompletionRequest, ctx: RequestContext, turn: _Turn) -> ProduceResult:
        """E-CoT: a segmented trace (context / reasoning / verification / outcome), checked by code
        and stored; experiences of the same model family are injected into the prompt."""
        assert self.experiences is not None
        meta = req.metadata or {}
        result = await self.experiences.produce(ctx.tenant, self.reasoner, last_user_text(req),
                                                domain=meta.get("task_domain", "general"),
                                                topic=meta.get("topic", "general"))
        exp = result.experience
        turn.meta["experience"] = {
            "id": exp.record.metadata.id if exp is not None else None,
            "tier": exp.tier if exp is not None else None,
            "confidence": exp.record.outcome.confidence if exp is not None else None,
            "injected": result.injected, "required_checks": result.required_checks,
            "parsed": result.answer is not None,
        }
        return result

    def _use_agent(self, req: ChatCompletionRequest) -> bool:
        # NOTE: a response_format constraint is the client's own protocol; the agent's JSON step
        # protocol would fight it, so such requests go straight to the reasoner.
        return self.agent is not None and req.response_format is None

    # ---- step 1: context -------------------------------------------------------------------
    async def _prepare(self, req: ChatCompletionRequest, ctx: RequestContext, params: GenerationParams) -> _Turn:
        system = "\n\n".join([self.settings.system_prompt] + [m.text() for m in req.messages
                                                               if m.role in ("system", "developer") and m.text()])
        convo = [m for m in req.messages if m.role not in ("system", "developer")]
        session_id = (req.metadata or {}).get("session_id")
        if self.context is None or not session_id:
            messages = [ChatMessage(role="system", content=system)]
            for m in convo:
                text = m.text() or ("[image attached]" if m.images() else "")
                messages.append(ChatMessage(role=engine_role(m.role), content=text))  # type: ignore[arg-type]
            return _Turn(messages=messages)
        mode = (req.metadata or {}).get("context_mode")
        try:
            session = await self.context.open_session(ctx.tenant, ctx.user, session_id)
            # NOTE: an echoed assistant turn that only carried tool calls has no text; it adds
            # nothing to the history, so it is skipped rather than stored empty.
            texts = [(m, m.text() or ("[image attached]" if m.images() else "")) for m in convo]
            pending = [MessageIn(role=m.role, content=t) for m, t in texts if t]  # type: ignore[arg-type]
            reserved = params.max_tokens + (self.settings.agent_overhead_tokens if self._use_agent(req) else 0)
            window = self.reasoner.context_window
            if reserved >= window:
                raise APIError(400, f"max_tokens: {params.max_tokens} leaves no room in the {window}-token context",
                               param="max_tokens")
            result = await self.context.assemble(session, pending, context_window=window, reserved_output=reserved,
                                                 system=system, mode=mode)  # type: ignore[arg-type]
        except SessionNotFoundError as exc:
            raise APIError(404, f"metadata.session_id: {exc}", type="not_found_error", param="metadata.session_id") from None
        except ValidationError as exc:
            # NOTE: what the request schema lets through but a session cannot hold (a session id or
            # user over 128 characters, an unknown context mode): the field by its request name.
            err = exc.errors()[0]
            param = _SESSION_FIELDS.get(str(err["loc"][0]) if err["loc"] else "", "metadata")
            raise APIError(400, f"{param}: {err['msg']} (sessions)", param=param) from None
        except ContextBudgetError as exc:
            raise APIError(400, f"messages: {exc}", param="messages", code="context_budget_exceeded") from None
        meta = {"context": {"session_id": session.id, "mode": result.mode, "requested_mode": result.requested_mode,
                            "budget": result.budget, "breakdown": result.breakdown.model_dump(),
                            "dropped_messages": result.dropped_messages, "latency_ms": round(result.latency_ms, 2)}}
        return _Turn(messages=list(result.messages), session=session, pending=pending, meta=meta)

    # ---- step 2a: plain recall + reasoner ------------------------------------------------------
    async def _recall(self, query: str, ctx: RequestContext) -> tuple[list[MemoryHit], str | None]:
        """Top-k memories of the tenant for ``query``; a failing memory tier degrades to none.

        Returns the hits and, when recall failed, the reason (reported in the response metadata
        so the degradation is visible, never silent).
        """
        if self.memory is None or self.settings.memory_top_k == 0 or not query.strip():
            return [], None
        try:
            async with asyncio.timeout(self.settings.memory_timeout_s):
                hits = await self.memory.search(ctx.tenant, query, self.settings.memory_top_k,
                                                threshold=self.settings.memory_threshold)
        except Exception as exc:  # noqa: BLE001 - any memory failure must not fail the chat
            log.warning("request %s: memory recall failed: %s", ctx.request_id, exc)
            return [], f"{type(exc).__name__}: {exc}"
        return hits, None

    async def _with_recall(self, req: ChatCompletionRequest, ctx: RequestContext, turn: _Turn) -> list[ChatMessage]:
        hits, error = await self._recall(last_user_text(req), ctx)
        turn.meta.update(memory_meta(hits, error))
        recalled = memory_message(hits, self.settings.memory_prompt_chars)
        if recalled is None:
            return turn.messages
        # NOTE: the system prompt stays first and unchanged so engines reuse its prompt cache.
        return [turn.messages[0], recalled, *turn.messages[1:]]

    # ---- step 2b: the agent ----------------------------------------------------------------------
    def _agent_request(self, req: ChatCompletionRequest, ctx: RequestContext, turn: _Turn) -> AgentRequest:
        msgs = [AgentMessage(role=m.role, text=m.content) for m in turn.messages[1:]]
        images = last_user_images(req)
        if images:
            for i in range(len(msgs) - 1, -1, -1):
                if msgs[i].role == "user":
                    msgs[i] = msgs[i].model_copy(update={"images": images})
                    break
        mode = (req.metadata or {}).get("agent", "auto")
        session_id = turn.session.id if turn.session is not None else (req.metadata or {}).get("session_id")
        return AgentRequest(tenant=ctx.tenant, scopes=list(self.settings.scopes), messages=msgs, mode=mode,  # type: ignore[arg-type]
                            session_id=session_id, max_answer_tokens=req.requested_max_tokens())

    def _agent_meta(self, turn: _Turn, result: AgentResult) -> None:
        turn.meta["agent"] = result.metadata()
        turn.meta["memories"] = [{"id": h.get("id"), "source_id": h.get("source_id"), "score": h.get("score")}
                                 for h in result.memory_hits]

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

    async def _finish_turn(self, req: ChatCompletionRequest, ctx: RequestContext, turn: _Turn, answer: str,
                           agent_result: AgentResult | None) -> None:
        """Append the turn to its session (on the request path: the next turn must see it), then
        schedule the rolling summary and the memory write-back off the request path."""
        if self.context is not None and turn.session is not None and answer.strip():
            await self.context.append(turn.session, [*turn.pending, MessageIn(role="assistant", content=answer)])
            self.context.start_summary(turn.session)
        if not self.settings.write_back or self.memory is None or not answer.strip():
            return
        if agent_result is not None and self.agent is not None:
            self._background_task(self.agent.write_back(ctx.tenant, agent_result), "memory write-back", ctx)
            return
        session = (req.metadata or {}).get("session_id", "")
        item = MemoryWrite(text=mask_pii(f"user: {last_user_text(req)}\nassistant: {answer}"), kind="message",
                           source_id=f"chat:{ctx.user}:{ctx.request_id}",
                           metadata={"user": ctx.user, "session_id": session})
        self._background_task(self.memory.write(ctx.tenant, [item]), "memory write-back", ctx)

    # ---- non-streaming ------------------------------------------------------------------------------
    async def complete(self, req: ChatCompletionRequest, ctx: RequestContext) -> ChatCompletionResponse:
        """Answer a non-streaming request."""
        self._check_model(req)
        params = self._params(req)
        turn = await self._prepare(req, ctx, params)
        agent_result: AgentResult | None = None
        try:
            async with asyncio.timeout(self.settings.engine_timeout_s):
                if self._segmented(req):
                    produced = await self._produce(req, ctx, turn)
                    text = produced.answer or produced.raw_text
                    prompt_tokens, completion_tokens = produced.prompt_tokens, produced.completion_tokens
                    finish = "stop"
                elif self._use_agent(req):
                    assert self.agent is not None
                    agent_result = await self.agent.run(self._agent_request(req, ctx, turn))
                    self._agent_meta(turn, agent_result)
                    text = agent_result.answer
                    prompt_tokens = agent_result.usage.prompt_tokens
                    completion_tokens = agent_result.usage.completion_tokens
                    finish = "stop"
                else:
                    result = await self.reasoner.chat(await self._with_recall(req, ctx, turn), params)
                    text, finish = result.text, result.finish_reason
                    prompt_tokens, completion_tokens = result.prompt_tokens, result.completion_tokens
                    turn.meta["engine_model"] = result.model
        except TimeoutError as exc:
            raise TimeoutError(f"no answer within {self.settings.engine_timeout_s:.0f} s") from exc
        TOKENS.labels("reasoner", "prompt").inc(prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(completion_tokens)
        await self._finish_turn(req, ctx, turn, text, agent_result)
        return ChatCompletionResponse(
            model=req.model,
            choices=[Choice(message=ResponseMessage(content=text), finish_reason=finish)],  # type: ignore[arg-type]
            usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                        total_tokens=prompt_tokens + completion_tokens),
            recallserve={"request_id": ctx.request_id, **turn.meta},
        )

    # ---- streaming ----------------------------------------------------------------------------------
    async def stream(self, req: ChatCompletionRequest, ctx: RequestContext) -> AsyncIterator[ChatCompletionChunk]:
        """Answer a streaming request chunk by chunk (validation happens before the first chunk)."""
        self._check_model(req)
        params = self._params(req)
        turn = await self._prepare(req, ctx, params)
        if self._segmented(req):
            return self._stream_segmented(req, ctx, turn)
        if self._use_agent(req):
            return self._stream_agent(req, ctx, turn)
        messages = await self._with_recall(req, ctx, turn)
        return self._stream_engine(req, ctx, turn, messages, params)

    def _chunk(self, req: ChatCompletionRequest, cid: str, created: int, **kw: Any) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=cid, created=created, model=req.model, **kw)

    async def _tail(self, req: ChatCompletionRequest, ctx: RequestContext, turn: _Turn, cid: str, created: int,
                    answer: str, finish: str, prompt_tokens: int, completion_tokens: int,
                    agent_result: AgentResult | None) -> AsyncIterator[ChatCompletionChunk]:
        TOKENS.labels("reasoner", "prompt").inc(prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(completion_tokens)
        await self._finish_turn(req, ctx, turn, answer, agent_result)
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(), finish_reason=finish)],  # type: ignore[arg-type]
                          recallserve={"request_id": ctx.request_id, **turn.meta})
        if req.stream_options and req.stream_options.include_usage:
            yield self._chunk(req, cid, created, choices=[],
                              usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                          total_tokens=prompt_tokens + completion_tokens))

    async def _stream_engine(self, req: ChatCompletionRequest, ctx: RequestContext, turn: _Turn,
                             messages: list[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatCompletionChunk]:
        cid, created, start = new_completion_id(), int(time.time()), time.perf_counter()
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])
        deadline = start + self.settings.engine_timeout_s
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
                    raise EngineError(f"reasoner stream exceeded {self.settings.engine_timeout_s:.0f} s") from exc
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
        async for chunk in self._tail(req, ctx, turn, cid, created, "".join(answer), finish, prompt_tokens,
                                      completion_tokens, None):
            yield chunk

    async def _stream_segmented(self, req: ChatCompletionRequest, ctx: RequestContext,
                                turn: _Turn) -> AsyncIterator[ChatCompletionChunk]:
        # NOTE: the answer is only known once the whole trace is parsed and verified, so it is
        # sent as one piece.
        cid, created = new_completion_id(), int(time.time())
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])
        try:
            async with asyncio.timeout(self.settings.engine_timeout_s):
                produced = await self._produce(req, ctx, turn)
        except TimeoutError as exc:
            raise EngineError(f"segmented reasoning exceeded {self.settings.engine_timeout_s:.0f} s") from exc
        text = produced.answer or produced.raw_text
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(content=text))])
        async for chunk in self._tail(req, ctx, turn, cid, created, text, "stop", produced.prompt_tokens,
                                      produced.completion_tokens, None):
            yield chunk

    async def _stream_agent(self, req: ChatCompletionRequest, ctx: RequestContext,
                            turn: _Turn) -> AsyncIterator[ChatCompletionChunk]:
        assert self.agent is not None
        cid, created, start = new_completion_id(), int(time.time()), time.perf_counter()
        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])
        result: AgentResult | None = None
        sent = False
        agen = self.agent.stream(self._agent_request(req, ctx, turn))
        try:
            async with asyncio.timeout(self.settings.engine_timeout_s):
                async for event in agen:
                    if event.type == "answer_delta" and event.text:
                        if not sent:
                            TIME_TO_FIRST_TOKEN.observe(time.perf_counter() - start)
                            sent = True
                        yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(content=event.text))])
                    elif event.type == "done":
                        result = event.result
        except TimeoutError as exc:
            raise EngineError(f"agent exceeded {self.settings.engine_timeout_s:.0f} s") from exc
        finally:
            await agen.aclose()
        if result is None:
            raise EngineError("agent stream ended without a result")
        if not sent and result.answer:
            yield self._chunk(req, cid, created, choices=[ChunkChoice(delta=DeltaMessage(content=result.answer))])
        self._agent_meta(turn, result)
        async for chunk in self._tail(req, ctx, turn, cid, created, result.answer, "stop", result.usage.prompt_tokens,
                                      result.usage.completion_tokens, result):
            yield chunk
