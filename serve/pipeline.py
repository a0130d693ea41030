"""The chat request pipeline, framework-free: OpenAI request in, OpenAI response out.

Steps for one turn (see ../shared/ARCHITECTURE.md): context assembly, memory recall, the router's
choice, the reasoner's answer, then write-back off the request path. Engines are
:class:`~serve.engine.LLMEngine` objects: in the cluster they are Ray handles wrapped by
``deployments/``, in tests the real llama.cpp engine in-process.
"""

from __future__ import annotations

import asyncio
import logging
import time
import uuid
from collections.abc import AsyncIterator

from pydantic import Field

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
from serve.agent.guards import mask_pii
from serve.engine import ChatMessage, EngineError, GenerationParams, LLMEngine
from serve.memory import MemoryBackend, MemoryHit, MemoryWrite

__all__ = ["RequestContext", "PipelineSettings", "ChatPipeline"]

log = logging.getLogger("recallserve.pipeline")


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


def _last_user_text(req: ChatCompletionRequest) -> str:
    """Text of the last user message (the recall query)."""
    for m in reversed(req.messages):
        if m.role == "user":
            return m.text()
    return ""


def _memory_meta(hits: list[MemoryHit], error: str | None) -> dict[str, object]:
    """Response metadata of the recall step."""
    meta: dict[str, object] = {
        "memories": [{"id": h.id, "source_id": h.source_id, "score": round(h.score, 4)} for h in hits]
    }
    if error is not None:
        meta["memory_error"] = error
    return meta


def _role(role: str) -> str:
    # NOTE: "developer" is the newer OpenAI name for "system".
    return "system" if role == "developer" else role


class ChatPipeline:
    """Answers OpenAI chat requests with the configured engines."""

    def __init__(self, reasoner: LLMEngine, settings: PipelineSettings | None = None,
                 memory: MemoryBackend | None = None) -> None:
        self.reasoner = reasoner
        self.settings = settings or PipelineSettings()
        self.memory = memory
        self._background: set[asyncio.Task[None]] = set()

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

    def _memory_message(self, hits: list[MemoryHit]) -> ChatMessage | None:
        """Recalled memories as one system message, most relevant first, within a character budget."""
        if not hits:
            return None
        lines, used = [], 0
        for i, hit in enumerate(hits, 1):
            when = time.strftime("%Y-%m-%d", time.gmtime(hit.created_at))
            line = f"[{i}] ({hit.kind}, {hit.source_id}, {when}) {hit.text.strip()}"
            if used + len(line) > self.settings.memory_prompt_chars:
                break
            lines.append(line)
            used += len(line)
        if not lines:
            return None
        return ChatMessage(role="system", content="Relevant memories (most relevant first; cite them by [n] when used):\n"
                           + "\n".join(lines))

    def _schedule_write_back(self, req: ChatCompletionRequest, ctx: RequestContext, answer: str) -> None:
        """Store the exchange as a memory after the answer is sent (PII masked first)."""
        if self.memory is None or not self.settings.write_back or not answer.strip():
            return
        question = _last_user_text(req)
        session = (req.metadata or {}).get("session_id", "")
        item = MemoryWrite(
            text=mask_pii(f"user: {question}\nassistant: {answer}"),
            kind="message",
            source_id=f"chat:{ctx.user}:{ctx.request_id}",
            metadata={"user": ctx.user, "session_id": session},
        )
        memory = self.memory

        async def write() -> None:
            try:
                await memory.write(ctx.tenant, [item])
            except Exception as exc:  # noqa: BLE001 - logged; the answer was already sent
                log.warning("request %s: memory write-back failed: %s", ctx.request_id, exc)

        task = asyncio.get_running_loop().create_task(write())
        self._background.add(task)
        task.add_done_callback(self._background.discard)

    def models(self) -> list[str]:
        """Model names this pipeline answers to."""
        return [self.settings.model_name]

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

    def _check_model(self, req: ChatCompletionRequest) -> None:
        if req.model not in self.models():
            raise APIError(404, f"model: unknown model {req.model!r}; available: {', '.join(self.models())}",
                           param="model", code="model_not_found")

    def _messages(self, req: ChatCompletionRequest, hits: list[MemoryHit] | None = None) -> list[ChatMessage]:
        # NOTE: the system prompt stays first and unchanged so engines reuse its prompt cache;
        # recalled memories follow it as a second system message.
        msgs = [ChatMessage(role="system", content=self.settings.system_prompt)]
        recalled = self._memory_message(hits or [])
        if recalled is not None:
            msgs.append(recalled)
        for m in req.messages:
            text = m.text()
            if m.images() and not text:
                text = "[image attached]"
            msgs.append(ChatMessage(role=_role(m.role), content=text))  # type: ignore[arg-type]
        return msgs

    async def complete(self, req: ChatCompletionRequest, ctx: RequestContext) -> ChatCompletionResponse:
        """Answer a non-streaming request."""
        self._check_model(req)
        params = self._params(req)
        hits, recall_error = await self._recall(_last_user_text(req), ctx)
        messages = self._messages(req, hits)
        try:
            async with asyncio.timeout(self.settings.engine_timeout_s):
                result = await self.reasoner.chat(messages, params)
        except TimeoutError as exc:
            raise TimeoutError(f"reasoner did not answer within {self.settings.engine_timeout_s:.0f} s") from exc
        TOKENS.labels("reasoner", "prompt").inc(result.prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(result.completion_tokens)
        self._schedule_write_back(req, ctx, result.text)
        return ChatCompletionResponse(
            model=req.model,
            choices=[Choice(message=ResponseMessage(content=result.text), finish_reason=result.finish_reason)],
            usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                        total_tokens=result.prompt_tokens + result.completion_tokens),
            recallserve={"request_id": ctx.request_id, "engine_model": result.model,
                         **_memory_meta(hits, recall_error)},
        )

    async def stream(self, req: ChatCompletionRequest, ctx: RequestContext) -> AsyncIterator[ChatCompletionChunk]:
        """Answer a streaming request chunk by chunk (validation happens before the first chunk)."""
        self._check_model(req)
        params = self._params(req)
        hits, recall_error = await self._recall(_last_user_text(req), ctx)
        messages = self._messages(req, hits)
        meta = {"request_id": ctx.request_id, **_memory_meta(hits, recall_error)}
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return self._stream(req, ctx, messages, params, include_usage, meta)

    async def _stream(self, req: ChatCompletionRequest, ctx: RequestContext, messages: list[ChatMessage],
                      params: GenerationParams, include_usage: bool,
                      meta: dict[str, object]) -> AsyncIterator[ChatCompletionChunk]:
        cid, created, start = new_completion_id(), int(time.time()), time.perf_counter()
        first = True
        prompt_tokens = completion_tokens = 0
        answer: list[str] = []
        yield ChatCompletionChunk(id=cid, created=created, model=req.model,
                                  choices=[ChunkChoice(delta=DeltaMessage(role="assistant", content=""))])
        deadline = start + self.settings.engine_timeout_s
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
                    answer.append(delta.text)
                    if first:
                        TIME_TO_FIRST_TOKEN.observe(time.perf_counter() - start)
                        first = False
                    yield ChatCompletionChunk(id=cid, created=created, model=req.model,
                                              choices=[ChunkChoice(delta=DeltaMessage(content=delta.text))])
                if delta.finish_reason is not None:
                    prompt_tokens = delta.prompt_tokens or 0
                    completion_tokens = delta.completion_tokens or 0
                    yield ChatCompletionChunk(id=cid, created=created, model=req.model,
                                              choices=[ChunkChoice(delta=DeltaMessage(), finish_reason=delta.finish_reason)],
                                              recallserve=meta)
        finally:
            await agen.aclose()
        TOKENS.labels("reasoner", "prompt").inc(prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(completion_tokens)
        self._schedule_write_back(req, ctx, "".join(answer))
        if include_usage:
            yield ChatCompletionChunk(id=cid, created=created, model=req.model, choices=[],
                                      usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                                  total_tokens=prompt_tokens + completion_tokens))
