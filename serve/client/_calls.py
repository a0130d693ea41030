"""Every endpoint the client calls, once: its method, path, body and the API model it answers with.

Bodies leave as given (an API request model, or its JSON as a dict) and are validated by the
server alone, so a bad field is always the API's own 400 naming it (raised as
:class:`~recallserve.client.RecallServeError`), the same for this client, the MCP tools and curl;
answers are read into the API's own response models.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any
from urllib.parse import quote

from pydantic import BaseModel

from recallserve.serve.api.chat_protocol import ChatCompletionResponse
from recallserve.serve.context import SessionOut, SummaryRefreshOut
from recallserve.serve.erasure import ErasureRow
from recallserve.serve.erasure.router import ErasureList
from recallserve.serve.experience import ExperienceView, LabelRequest
from recallserve.serve.experience import SearchRequest as ExperienceSearchRequest
from recallserve.serve.experience import SearchResult as ExperienceSearchResult
from recallserve.serve.memory_api.schemas import (AddMemoriesResponse, DecayIn, DeleteResponse, FiltersIn, MemoryIn, MemoryList,
                                                  MemoryOut, SearchResponse)
from recallserve.serve.traces import TraceSessionList, TurnList, TurnTrace
from recallserve.client._core import Call

__all__ = ["MODEL"]

#: The model name the chat route answers to (any name is accepted; this is the documented one).
MODEL = "recallserve"


def _seg(value: str) -> str:
    """A path segment, percent-encoded (an id with '/' or '?' stays one segment)."""
    return quote(value, safe="")


def _dump(value: Any) -> Any:
    """A request model as its JSON (fields the caller set only); anything else unchanged."""
    if isinstance(value, BaseModel):
        return value.model_dump(mode="json", exclude_unset=True)
    return dict(value) if isinstance(value, Mapping) else value


def health() -> Call[dict[str, Any]]:
    return Call("GET", "/healthz", dict[str, Any])


def metrics() -> Call[str]:
    """Prometheus text (read as text, not JSON)."""
    return Call("GET", "/metrics", str)


def models() -> Call[dict[str, Any]]:
    """``GET /v1/models`` (authenticated, as the OpenAI API's)."""
    return Call("GET", "/v1/models", dict[str, Any])


def add_memories(memories: Sequence[MemoryIn | Mapping[str, Any]]) -> Call[AddMemoriesResponse]:
    return add_body({"memories": [_dump(m) for m in memories]})


def add_body(body: Mapping[str, Any]) -> Call[AddMemoriesResponse]:
    """``POST /v1/memories`` with a body as given (``{"memories": [...]}``)."""
    return Call("POST", "/v1/memories", AddMemoriesResponse, json=dict(body))


def search_memories(query: str, *, k: int | None = None, threshold: float | None = None,
                    filters: FiltersIn | Mapping[str, Any] | None = None, decay: DecayIn | Mapping[str, Any] | None = None,
                    hybrid: bool | None = None) -> Call[SearchResponse]:
    fields: dict[str, Any] = {"query": query, "k": k, "threshold": threshold, "filters": filters, "decay": decay,
                              "hybrid": hybrid}
    return search_body({n: _dump(v) for n, v in fields.items() if v is not None})


def search_body(body: Mapping[str, Any]) -> Call[SearchResponse]:
    """``POST /v1/memories/search`` with a body as given (``{"query": ..., "k": ...}``)."""
    return Call("POST", "/v1/memories/search", SearchResponse, json=dict(body))


def get_memory(memory_id: str) -> Call[MemoryOut]:
    return Call("GET", f"/v1/memories/{_seg(memory_id)}", MemoryOut)


def list_memories(source_id: str) -> Call[MemoryList]:
    return Call("GET", "/v1/memories", MemoryList, params={"source_id": source_id})


def delete_memory(memory_id: str) -> Call[DeleteResponse]:
    return Call("DELETE", f"/v1/memories/{_seg(memory_id)}", DeleteResponse)


def create_experience(record: BaseModel | Mapping[str, Any]) -> Call[ExperienceView]:
    """The stored form or the design's v1.2 JSON (the server tells them apart)."""
    return Call("POST", "/v1/experiences", ExperienceView, json=_dump(record))


def search_experiences(request: ExperienceSearchRequest | Mapping[str, Any]) -> Call[ExperienceSearchResult]:
    return Call("POST", "/v1/experiences/search", ExperienceSearchResult, json=_dump(request))


def get_experience(exp_id: str) -> Call[ExperienceView]:
    return Call("GET", f"/v1/experiences/{_seg(exp_id)}", ExperienceView)


def review_experiences(limit: int = 50) -> Call[list[ExperienceView]]:
    return Call("GET", "/v1/experiences/review", list[ExperienceView], params={"limit": limit})


def label_experience(exp_id: str, request: LabelRequest | Mapping[str, Any]) -> Call[ExperienceView]:
    return Call("POST", f"/v1/experiences/{_seg(exp_id)}/label", ExperienceView, json=_dump(request))


def get_session(session_id: str, user: str = "default") -> Call[SessionOut]:
    return Call("GET", f"/v1/sessions/{_seg(session_id)}", SessionOut, params={"user": user})


def refresh_summary(session_id: str, user: str = "default") -> Call[SummaryRefreshOut]:
    return Call("POST", f"/v1/sessions/{_seg(session_id)}/summary", SummaryRefreshOut, params={"user": user})


def list_turns(limit: int = 50, session_id: str | None = None, before: float | None = None) -> Call[TurnList]:
    params: dict[str, Any] = {"limit": limit, "session_id": session_id, "before": before}
    return Call("GET", "/v1/turns", TurnList, params={n: v for n, v in params.items() if v is not None})


def list_turn_sessions(limit: int = 50) -> Call[TraceSessionList]:
    return Call("GET", "/v1/turns/sessions", TraceSessionList, params={"limit": limit})


def get_turn(turn_id: str) -> Call[TurnTrace]:
    return Call("GET", f"/v1/turns/{_seg(turn_id)}", TurnTrace)


def erase_user(user: str) -> Call[ErasureRow]:
    """``DELETE /v1/users/{user}``: 202 with the erasure's id; progress via :func:`get_erasure`."""
    return Call("DELETE", f"/v1/users/{_seg(user)}", ErasureRow)


def erase_tenant(tenant: str) -> Call[ErasureRow]:
    """``DELETE /v1/tenants/{tenant}`` (an admin key only): 202 with the erasure's id; progress via :func:`get_erasure`."""
    return Call("DELETE", f"/v1/tenants/{_seg(tenant)}", ErasureRow)


def get_erasure(erasure_id: str) -> Call[ErasureRow]:
    return Call("GET", f"/v1/erasures/{_seg(erasure_id)}", ErasureRow)


def list_erasures(limit: int = 50) -> Call[ErasureList]:
    return Call("GET", "/v1/erasures", ErasureList, params={"limit": limit})


def export_user(user: str) -> Call[dict[str, Any]]:
    """``GET /v1/users/{user}/export``: everything held for the user, as one JSON document."""
    return Call("GET", f"/v1/users/{_seg(user)}/export", dict[str, Any])


def chat(messages: Sequence[Mapping[str, Any]], **options: Any) -> Call[ChatCompletionResponse]:
    """One plain chat turn; ``options`` are the request's other fields (``max_tokens``, ``metadata``, ``user``).

    NOTE: streaming is the OpenAI SDK's job (``openai.OpenAI(base_url=client.openai_base_url)``):
    ``stream=True`` is refused here rather than read as one JSON answer.
    """
    if options.get("stream"):
        raise ValueError("stream: use the OpenAI SDK for streaming (see docs/mcp.md, 'Streaming chat')")
    return Call("POST", "/v1/chat/completions", ChatCompletionResponse,
                json={"model": MODEL, "messages": [_dump(m) for m in messages], **options})


def ask(question: str, *, session_id: str | None = None, user: str | None = None,
        max_tokens: int | None = None) -> Call[ChatCompletionResponse]:
    """One user question as a chat turn, optionally in a server-kept session (``metadata.session_id``)."""
    options: dict[str, Any] = {}
    if session_id is not None:
        options["metadata"] = {"session_id": session_id}
    if user is not None:
        options["user"] = user
    if max_tokens is not None:
        options["max_tokens"] = max_tokens
    return chat([{"role": "user", "content": question}], **options)
