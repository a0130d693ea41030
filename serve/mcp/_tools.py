"""The MCP tools: each one a REST route of the API, its input schema the route's own request model.

A tool's arguments are the route's JSON body (``add_memories``, ``search_memories``,
``search_experiences``) or its path/query parameter (``get_memory``, ``list_memories``,
``delete_memory``); ``ask`` is one user message to ``/v1/chat/completions``. The arguments are not
validated here against anything but their presence and JSON type: the route validates them, so
a bad value gets the route's own message (``"k: Input should be less than or equal to 200"``).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import BaseModel, Field, ValidationError

from recallserve.client import Call
import recallserve.client._calls as calls
from recallserve.kernels import StrictModel
from recallserve.serve.api.errors import describe_error
from recallserve.serve.experience import SearchRequest as ExperienceSearchRequest
from recallserve.serve.memory_api.schemas import AddMemoriesRequest, SearchRequest

__all__ = ["TOOLS", "Tool", "ToolArgumentError", "AskArgs"]


class ToolArgumentError(ValueError):
    """Arguments that cannot make a request at all (a required one missing, a wrong JSON type)."""


class MemoryIdArgs(StrictModel):
    memory_id: str = Field(description="The memory's id (as add_memories or search_memories gave it).")


class SourceIdArgs(StrictModel):
    source_id: str = Field(description="The dedup key the memories were added with.")


class AskArgs(StrictModel):
    """One question to the agent: a chat turn that recalls the caller's memories."""

    question: Annotated[str, Field(description="The user's message.")]
    session_id: str | None = Field(default=None, description="Keep the conversation on the server under this id "
                                                             "(context-mode: pinned facts, a rolling summary).")
    user: str | None = Field(default=None, description="End-user id; sessions and memories are per user.")
    max_tokens: int | None = Field(default=None, description="Most tokens of the answer.")


def _args(model: type[BaseModel], arguments: Mapping[str, Any]) -> Any:
    try:
        return model.model_validate(dict(arguments))
    except ValidationError as exc:
        raise ToolArgumentError("; ".join(describe_error(e)[1] for e in exc.errors()[:5])) from None


def _ask(arguments: Mapping[str, Any]) -> Call[Any]:
    a = _args(AskArgs, arguments)
    return calls.ask(a.question, session_id=a.session_id, user=a.user, max_tokens=a.max_tokens)


def _answer(result: dict[str, Any]) -> dict[str, Any]:
    """The chat answer (the route's JSON) as the tool's result: the text, the completion id and the token usage."""
    choice = result["choices"][0] if result.get("choices") else {}
    return {"answer": (choice.get("message") or {}).get("content") or "", "finish_reason": choice.get("finish_reason"),
            "id": result.get("id"), "usage": result.get("usage")}


@dataclass(frozen=True)
class Tool:
    """One MCP tool: its name, what a model reads about it, its input schema and the request it makes."""

    name: str
    description: str
    schema: type[BaseModel]
    call: Callable[[Mapping[str, Any]], Call[Any]]
    #: The tool's structured result from the route's JSON answer (None: the answer as it is).
    result: Callable[[dict[str, Any]], dict[str, Any]] | None = None
    read_only: bool = True

    def input_schema(self) -> dict[str, Any]:
        return self.schema.model_json_schema()



TOOLS: dict[str, Tool] = {t.name: t for t in (
    Tool("add_memories",
         "Store memories for the caller's tenant (durable when answered). Each memory needs 'text'; "
         "'source_id' makes a later memory with the same id replace it. Personal data is masked "
         "(or refused) per the tenant's policy. Returns the new memory ids in order.",
         AddMemoriesRequest, calls.add_body, read_only=False),
    Tool("search_memories",
         "Hybrid search (dense embeddings fused with BM25) of the caller's memories, best first. "
         "Options: k results, a cosine threshold, filters (kinds, topic prefix, metadata equality, time "
         "range), time decay, hybrid=false for dense only.",
         SearchRequest, calls.search_body),
    Tool("get_memory", "One of the caller's memories by its id.", MemoryIdArgs,
         lambda a: calls.get_memory(_args(MemoryIdArgs, a).memory_id)),
    Tool("list_memories", "The caller's memories stored under one source id (dedup key), oldest first.",
         SourceIdArgs, lambda a: calls.list_memories(_args(SourceIdArgs, a).source_id)),
    Tool("delete_memory", "Delete one of the caller's memories by its id (durable when answered).", MemoryIdArgs,
         lambda a: calls.delete_memory(_args(MemoryIdArgs, a).memory_id), read_only=False),
    Tool("search_experiences",
         "Search the caller's verified reasoning experiences (E-CoT) of one model family: active hits "
         "by recency and similarity, optional archival lessons by topic or error tags, conflict alerts.",
         ExperienceSearchRequest, calls.search_experiences),
    Tool("ask",
         "Ask the recallserve agent one question: a chat turn that recalls the caller's memories (and "
         "writes the exchange back), optionally inside a server-kept session. Returns the answer text.",
         AskArgs, _ask, result=_answer, read_only=False),
)}
