"""``RecallServe`` (blocking) and ``AsyncRecallServe``: the API's endpoints as typed methods.

Both send the calls of :mod:`._calls` through one httpx client each, with the retry rules of
:mod:`._core`; their methods mirror each other one to one (the async ones are awaited), as the
OpenAI SDK's two clients do. Streaming chat is the OpenAI SDK's job: ``openai_base_url`` is the
address to give it (see docs/mcp.md). ``http`` is the configured httpx client itself (base URL,
key, pool), for what is not an API call with a model: a bench timing raw SSE chunks.
"""

from __future__ import annotations

import asyncio
import ssl
import time
from collections.abc import Mapping, Sequence
from types import TracebackType
from typing import Any, TypeVar

import httpx
from pydantic import BaseModel

from recallserve.serve.api.chat_protocol import ChatCompletionResponse
import recallserve.client._calls as calls
from recallserve.client._core import DEFAULT_URL, IDEMPOTENT, Call, RetryPolicy, decode, headers_for, retry_delay, retryable_status
from recallserve.client._errors import ConnectionFailed
from recallserve.serve.context import SessionOut, SummaryRefreshOut
from recallserve.serve.erasure import ErasureRow
from recallserve.serve.erasure.router import ErasureList
from recallserve.serve.experience import ExperienceView, LabelRequest
from recallserve.serve.experience import SearchRequest as ExperienceSearchRequest
from recallserve.serve.experience import SearchResult as ExperienceSearchResult
from recallserve.serve.memory_api.schemas import (AddMemoriesResponse, DecayIn, DeleteResponse, FiltersIn, MemoryIn, MemoryList,
                                                  MemoryOut, SearchResponse)
from recallserve.serve.traces import TraceSessionList, TurnList, TurnTrace

__all__ = ["AsyncRecallServe", "RecallServe"]

T = TypeVar("T")
Body = Mapping[str, Any] | BaseModel


def _client_args(base_url: str, api_key: str | None, timeout: float | httpx.Timeout | None,
                 headers: Mapping[str, str] | None, limits: httpx.Limits | None, verify: ssl.SSLContext | bool) -> dict[str, Any]:
    pool = {"limits": limits} if limits is not None else {}
    return {"base_url": base_url.rstrip("/"), "timeout": timeout, "headers": {**headers_for(api_key), **(headers or {})},
            "verify": verify, **pool}


def _no_answer(call: Call[Any], exc: httpx.HTTPError) -> ConnectionFailed:
    return ConnectionFailed(f"{call.method} {call.path}: no answer ({type(exc).__name__}: {exc})", type(exc).__name__)


class RecallServe:
    """Blocking client of a recallserve cluster.

    Args:
        base_url: the cluster (``http://127.0.0.1:8000`` for ``recallserve up``).
        api_key: sent as ``Authorization: Bearer <key>``; the key decides the tenant.
        timeout: seconds per request (or an ``httpx.Timeout``).
        retry: retries of 429/503 answers and of failed idempotent requests.
        transport: an httpx transport (tests, or ``httpx.ASGITransport(app)`` in process).
        headers: extra headers on every request.
        limits: the connection pool's bounds (httpx's default: 100 connections).
        verify: TLS verification (one ``ssl.SSLContext`` may be shared by many clients).

    Example:
        >>> with RecallServe(api_key="sk-local") as rs:  # doctest: +SKIP
        ...     rs.memories.add([{"text": "The printer error E-31 means a paper jam."}])
        ...     rs.memories.search("what is E-31?", k=3).data[0].text
    """

    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, *,
                 timeout: float | httpx.Timeout | None = 60.0, retry: RetryPolicy | None = None,
                 transport: httpx.BaseTransport | None = None, headers: Mapping[str, str] | None = None,
                 limits: httpx.Limits | None = None, verify: ssl.SSLContext | bool = True) -> None:
        self.http = httpx.Client(transport=transport, **_client_args(base_url, api_key, timeout, headers, limits, verify))
        self.retry = retry or RetryPolicy()
        self.openai_base_url = f"{base_url.rstrip('/')}/v1"
        self.memories = Memories(self)
        self.experiences = Experiences(self)
        self.sessions = Sessions(self)
        self.turns = Turns(self)
        self.users = Users(self)

    def send(self, call: Call[T], retry: RetryPolicy | None = None) -> T:
        """``call``'s answer as its model; retries per ``retry`` (default :attr:`retry`); raises ``RecallServeError``."""
        policy = retry or self.retry
        for attempt in range(policy.max_retries + 1):
            last = attempt == policy.max_retries
            try:
                response = self.http.request(call.method, call.path, json=call.json, params=call.params or None)
            except httpx.TransportError as exc:
                if last or call.method not in IDEMPOTENT:
                    raise _no_answer(call, exc) from exc
                time.sleep(retry_delay(policy, attempt, None))
                continue
            if last or not retryable_status(call, response.status_code):
                return decode(call, response)
            time.sleep(retry_delay(policy, attempt, response))
        raise AssertionError("unreachable: the last attempt returns or raises")

    def health(self) -> dict[str, Any]:
        """``GET /healthz``: status, models, warm-up state."""
        return self.send(calls.health())

    def metrics(self) -> str:
        """``GET /metrics``: the Prometheus text of the replica that answered."""
        return self.send(calls.metrics())

    def models(self) -> dict[str, Any]:
        """``GET /v1/models``: the OpenAI-style list of the model names the chat route serves."""
        return self.send(calls.models())

    def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> ChatCompletionResponse:
        """One plain chat turn (``options``: ``max_tokens``, ``metadata``, ``user``, ...)."""
        return self.send(calls.chat(messages, **options))

    def ask(self, question: str, *, session_id: str | None = None, user: str | None = None,
            max_tokens: int | None = None) -> ChatCompletionResponse:
        """One question as a chat turn, optionally in a server-kept session."""
        return self.send(calls.ask(question, session_id=session_id, user=user, max_tokens=max_tokens))

    def close(self) -> None:
        self.http.close()

    def __enter__(self) -> RecallServe:
        return self

    def __exit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        self.close()


class AsyncRecallServe:
    """Async client of a recallserve cluster; the same arguments and methods as :class:`RecallServe`, awaited."""

    def __init__(self, base_url: str = DEFAULT_URL, api_key: str | None = None, *,
                 timeout: float | httpx.Timeout | None = 60.0, retry: RetryPolicy | None = None,
                 transport: httpx.AsyncBaseTransport | None = None, headers: Mapping[str, str] | None = None,
                 limits: httpx.Limits | None = None, verify: ssl.SSLContext | bool = True) -> None:
        self.http = httpx.AsyncClient(transport=transport, **_client_args(base_url, api_key, timeout, headers, limits, verify))
        self.retry = retry or RetryPolicy()
        self.openai_base_url = f"{base_url.rstrip('/')}/v1"
        self.memories = AsyncMemories(self)
        self.experiences = AsyncExperiences(self)
        self.sessions = AsyncSessions(self)
        self.turns = AsyncTurns(self)
        self.users = AsyncUsers(self)

    async def send(self, call: Call[T], headers: Mapping[str, str] | None = None, retry: RetryPolicy | None = None) -> T:
        """``call``'s answer as its model; retries per ``retry`` (default :attr:`retry`); raises ``RecallServeError``.

        ``headers``: extra headers of this request alone (the MCP tools pass the caller's key).
        """
        policy = retry or self.retry
        for attempt in range(policy.max_retries + 1):
            last = attempt == policy.max_retries
            try:
                response = await self.http.request(call.method, call.path, json=call.json, params=call.params or None,
                                                   headers=headers)
            except httpx.TransportError as exc:
                if last or call.method not in IDEMPOTENT:
                    raise _no_answer(call, exc) from exc
                await asyncio.sleep(retry_delay(policy, attempt, None))
                continue
            if last or not retryable_status(call, response.status_code):
                return decode(call, response)
            await asyncio.sleep(retry_delay(policy, attempt, response))
        raise AssertionError("unreachable: the last attempt returns or raises")

    async def health(self) -> dict[str, Any]:
        return await self.send(calls.health())

    async def metrics(self) -> str:
        return await self.send(calls.metrics())

    async def models(self) -> dict[str, Any]:
        return await self.send(calls.models())

    async def chat(self, messages: Sequence[Mapping[str, Any]], **options: Any) -> ChatCompletionResponse:
        return await self.send(calls.chat(messages, **options))

    async def ask(self, question: str, *, session_id: str | None = None, user: str | None = None,
                  max_tokens: int | None = None) -> ChatCompletionResponse:
        return await self.send(calls.ask(question, session_id=session_id, user=user, max_tokens=max_tokens))

    async def aclose(self) -> None:
        await self.http.aclose()

    async def __aenter__(self) -> AsyncRecallServe:
        return self

    async def __aexit__(self, et: type[BaseException] | None, ev: BaseException | None, tb: TracebackType | None) -> None:
        await self.aclose()


class Memories:
    """``/v1/memories`` (blocking)."""

    def __init__(self, client: RecallServe) -> None:
        self._c = client

    def add(self, memories: Sequence[MemoryIn | Mapping[str, Any]]) -> AddMemoriesResponse:
        return self._c.send(calls.add_memories(memories))

    def search(self, query: str, *, k: int | None = None, threshold: float | None = None,
               filters: FiltersIn | Mapping[str, Any] | None = None, decay: DecayIn | Mapping[str, Any] | None = None,
               hybrid: bool | None = None) -> SearchResponse:
        return self._c.send(calls.search_memories(query, k=k, threshold=threshold, filters=filters, decay=decay, hybrid=hybrid))

    def get(self, memory_id: str) -> MemoryOut:
        return self._c.send(calls.get_memory(memory_id))

    def list(self, source_id: str) -> MemoryList:
        return self._c.send(calls.list_memories(source_id))

    def delete(self, memory_id: str) -> DeleteResponse:
        return self._c.send(calls.delete_memory(memory_id))


class AsyncMemories:
    """``/v1/memories`` (async)."""

    def __init__(self, client: AsyncRecallServe) -> None:
        self._c = client

    async def add(self, memories: Sequence[MemoryIn | Mapping[str, Any]]) -> AddMemoriesResponse:
        return await self._c.send(calls.add_memories(memories))

    async def search(self, query: str, *, k: int | None = None, threshold: float | None = None,
                     filters: FiltersIn | Mapping[str, Any] | None = None, decay: DecayIn | Mapping[str, Any] | None = None,
                     hybrid: bool | None = None) -> SearchResponse:
        return await self._c.send(calls.search_memories(query, k=k, threshold=threshold, filters=filters, decay=decay,
                                                        hybrid=hybrid))

    async def get(self, memory_id: str) -> MemoryOut:
        return await self._c.send(calls.get_memory(memory_id))

    async def list(self, source_id: str) -> MemoryList:
        return await self._c.send(calls.list_memories(source_id))

    async def delete(self, memory_id: str) -> DeleteResponse:
        return await self._c.send(calls.delete_memory(memory_id))


class Experiences:
    """``/v1/experiences`` (blocking)."""

    def __init__(self, client: RecallServe) -> None:
        self._c = client

    def create(self, record: Body) -> ExperienceView:
        return self._c.send(calls.create_experience(record))

    def search(self, request: ExperienceSearchRequest | Mapping[str, Any]) -> ExperienceSearchResult:
        return self._c.send(calls.search_experiences(request))

    def get(self, exp_id: str) -> ExperienceView:
        return self._c.send(calls.get_experience(exp_id))

    def review(self, limit: int = 50) -> list[ExperienceView]:
        return self._c.send(calls.review_experiences(limit))

    def label(self, exp_id: str, request: LabelRequest | Mapping[str, Any]) -> ExperienceView:
        return self._c.send(calls.label_experience(exp_id, request))


class AsyncExperiences:
    """``/v1/experiences`` (async)."""

    def __init__(self, client: AsyncRecallServe) -> None:
        self._c = client

    async def create(self, record: Body) -> ExperienceView:
        return await self._c.send(calls.create_experience(record))

    async def search(self, request: ExperienceSearchRequest | Mapping[str, Any]) -> ExperienceSearchResult:
        return await self._c.send(calls.search_experiences(request))

    async def get(self, exp_id: str) -> ExperienceView:
        return await self._c.send(calls.get_experience(exp_id))

    async def review(self, limit: int = 50) -> list[ExperienceView]:
        return await self._c.send(calls.review_experiences(limit))

    async def label(self, exp_id: str, request: LabelRequest | Mapping[str, Any]) -> ExperienceView:
        return await self._c.send(calls.label_experience(exp_id, request))


class Sessions:
    """``/v1/sessions`` (blocking)."""

    def __init__(self, client: RecallServe) -> None:
        self._c = client

    def get(self, session_id: str, user: str = "default") -> SessionOut:
        return self._c.send(calls.get_session(session_id, user))

    def refresh_summary(self, session_id: str, user: str = "default") -> SummaryRefreshOut:
        return self._c.send(calls.refresh_summary(session_id, user))


class AsyncSessions:
    """``/v1/sessions`` (async)."""

    def __init__(self, client: AsyncRecallServe) -> None:
        self._c = client

    async def get(self, session_id: str, user: str = "default") -> SessionOut:
        return await self._c.send(calls.get_session(session_id, user))

    async def refresh_summary(self, session_id: str, user: str = "default") -> SummaryRefreshOut:
        return await self._c.send(calls.refresh_summary(session_id, user))


class Turns:
    """``/v1/turns`` (blocking): traces of chat turns."""

    def __init__(self, client: RecallServe) -> None:
        self._c = client

    def list(self, limit: int = 50, session_id: str | None = None, before: float | None = None) -> TurnList:
        return self._c.send(calls.list_turns(limit, session_id, before))

    def sessions(self, limit: int = 50) -> TraceSessionList:
        return self._c.send(calls.list_turn_sessions(limit))

    def get(self, turn_id: str) -> TurnTrace:
        return self._c.send(calls.get_turn(turn_id))


class AsyncTurns:
    """``/v1/turns`` (async): traces of chat turns."""

    def __init__(self, client: AsyncRecallServe) -> None:
        self._c = client

    async def list(self, limit: int = 50, session_id: str | None = None, before: float | None = None) -> TurnList:
        return await self._c.send(calls.list_turns(limit, session_id, before))

    async def sessions(self, limit: int = 50) -> TraceSessionList:
        return await self._c.send(calls.list_turn_sessions(limit))

    async def get(self, turn_id: str) -> TurnTrace:
        return await self._c.send(calls.get_turn(turn_id))


class Users:
    """End users of the caller's tenant (blocking): erasure, its progress and audit, export."""

    def __init__(self, client: RecallServe) -> None:
        self._c = client

    def erase(self, user: str) -> ErasureRow:
        return self._c.send(calls.erase_user(user))

    def erase_tenant(self, tenant: str) -> ErasureRow:
        """Erase a whole tenant (an admin key only; any other key gets a 403)."""
        return self._c.send(calls.erase_tenant(tenant))

    def erasure(self, erasure_id: str) -> ErasureRow:
        return self._c.send(calls.get_erasure(erasure_id))

    def erasures(self, limit: int = 50) -> ErasureList:
        return self._c.send(calls.list_erasures(limit))

    def export(self, user: str) -> dict[str, Any]:
        return self._c.send(calls.export_user(user))


class AsyncUsers:
    """End users of the caller's tenant (async): erasure, its progress and audit, export."""

    def __init__(self, client: AsyncRecallServe) -> None:
        self._c = client

    async def erase(self, user: str) -> ErasureRow:
        return await self._c.send(calls.erase_user(user))

    async def erase_tenant(self, tenant: str) -> ErasureRow:
        """Erase a whole tenant (an admin key only; any other key gets a 403)."""
        return await self._c.send(calls.erase_tenant(tenant))

    async def erasure(self, erasure_id: str) -> ErasureRow:
        return await self._c.send(calls.get_erasure(erasure_id))

    async def erasures(self, limit: int = 50) -> ErasureList:
        return await self._c.send(calls.list_erasures(limit))

    async def export(self, user: str) -> dict[str, Any]:
        return await self._c.send(calls.export_user(user))
