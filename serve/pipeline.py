"""The chat request pipeline, framework-free: OpenAI request in, OpenAI response out.

Steps for one turn (see ../shared/ARCHITECTURE.md): context assembly, memory recall, the router's
choice, the reasoner's answer, then write-back off the request path. Engines are
:class:`~serve.engine.LLMEngine` objects: in the cluster they are Ray handles wrapped by
``deployments/``, in tests the real llama.cpp engine in-process.
"""

from __future__ import annotations

import asyncio
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
from serve.engine import ChatMessage, EngineError, GenerationParams, LLMEngine

__all__ = ["RequestContext", "PipelineSettings", "ChatPipeline"]


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


def _role(role: str) -> str:
    # NOTE: "developer" is the newer OpenAI name for "system".
    return "system" if role == "developer" else role


class ChatPipeline:
    """Answers OpenAI chat requests with the configured engines."""

    def __init__(self, reasoner: LLMEngine, settings: PipelineSettings | None = None) -> None:
        self.reasoner = reasoner
        self.settings = settings or PipelineSettings()

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

    def _messages(self, req: ChatCompletionRequest) -> list[ChatMessage]:
        msgs = [ChatMessage(role="system", content=self.settings.system_prompt)]
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
        messages = self._messages(req)
        try:
            async with asyncio.timeout(self.settings.engine_timeout_s):
                result = await self.reasoner.chat(messages, params)
        except TimeoutError as exc:
            raise TimeoutError(f"reasoner did not answer within {self.settings.engine_timeout_s:.0f} s") from exc
        TOKENS.labels("reasoner", "prompt").inc(result.prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(result.completion_tokens)
        return ChatCompletionResponse(
            model=req.model,
            choices=[Choice(message=ResponseMessage(content=result.text), finish_reason=result.finish_reason)],
            usage=Usage(prompt_tokens=result.prompt_tokens, completion_tokens=result.completion_tokens,
                        total_tokens=result.prompt_tokens + result.completion_tokens),
            recallserve={"request_id": ctx.request_id, "engine_model": result.model},
        )

    async def stream(self, req: ChatCompletionRequest, ctx: RequestContext) -> AsyncIterator[ChatCompletionChunk]:
        """Answer a streaming request chunk by chunk (validation happens before the first chunk)."""
        self._check_model(req)
        params = self._params(req)
        messages = self._messages(req)
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        return self._stream(req, ctx, messages, params, include_usage)

    async def _stream(self, req: ChatCompletionRequest, ctx: RequestContext, messages: list[ChatMessage],
                      params: GenerationParams, include_usage: bool) -> AsyncIterator[ChatCompletionChunk]:
        cid, created, start = new_completion_id(), int(time.time()), time.perf_counter()
        first = True
        prompt_tokens = completion_tokens = 0
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
                                              recallserve={"request_id": ctx.request_id})
        finally:
            await agen.aclose()
        TOKENS.labels("reasoner", "prompt").inc(prompt_tokens)
        TOKENS.labels("reasoner", "completion").inc(completion_tokens)
        if include_usage:
            yield ChatCompletionChunk(id=cid, created=created, model=req.model, choices=[],
                                      usage=Usage(prompt_tokens=prompt_tokens, completion_tokens=completion_tokens,
                                                  total_tokens=prompt_tokens + completion_tokens))
