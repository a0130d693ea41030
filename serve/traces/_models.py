"""The turn trace: what one chat turn did, as an operator reads it afterwards.

A :class:`TurnTrace` is built once per answered turn by :func:`recallserve.serve.traces.build_trace` from
the :class:`~recallserve.serve.turn.Turn`, the agent's result (route, steps, tool calls) and the prompt the
reasoner received (``Answer.prompt`` of :mod:`recallserve.serve.pipeline`, rendered by
:func:`recallserve.serve.turn.render_prompt`);
it is PII-masked and cut to the configured sizes before it is stored.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from recallserve.kernels import StrictModel

__all__ = ["TraceConfig", "TurnTrace", "TraceSummary", "TraceSession", "TraceNotFoundError", "TURN_ID_CHARS"]

TURN_ID_CHARS = 128
"""NOTE: a turn's id is its request id (serve.api.limits: at most 128 characters), kept masked to a
key of at most this length (serve.pii.mask_id) when it holds personal data."""


class TraceNotFoundError(LookupError):
    """No trace of this id in the caller's tenant (also when another tenant holds it)."""


class TraceConfig(StrictModel):
    """How long and how much of the agent's turn traces the server keeps (``traces`` section)."""

    enabled: bool = Field(default=True, description="Store a trace of every answered chat turn (read at /v1/turns).")
    retention_days: float = Field(
        default=7.0, gt=0, le=365, description="Days a trace is kept; older ones are deleted on the next write."
    )
    max_per_tenant: int = Field(
        default=5000, ge=1, le=1_000_000,
        description="Most traces kept per tenant; the oldest go first (bounds the file: ~20 KB a trace).",
    )
    text_chars: int = Field(
        default=2000, ge=100, le=100_000,
        description="Most characters of one stored text (question, answer, thought, observation, memory).",
    )
    prompt_chars: int = Field(
        default=16_000, ge=500, le=400_000,
        description="Most characters of the stored prompt (all its messages together); the rest is cut, marked.",
    )


class TurnTrace(StrictModel):
    """One answered chat turn (PII-masked)."""

    id: str = Field(description="The request id of the turn (x-request-id), masked to a key when it holds personal data.")
    created_at: float = Field(description="When the answer was sent, epoch seconds.")
    user: str = Field(description="End user (the request's `user`).")
    session_id: str | None = Field(default=None, description="Session of the turn (metadata.session_id).")
    path: Literal["agent", "plain", "segmented"] = Field(description="Which path answered.")
    stream: bool = Field(default=False, description="True when the answer was streamed.")
    question: str = Field(description="The user's question.")
    answer: str = Field(description="The answer sent.")
    finish_reason: str = Field(description="Why the answer ended (stop, length, final, max_steps, timeout, ...).")
    route: dict[str, Any] | None = Field(default=None, description="The router's decision (agent path).")
    steps: list[dict[str, Any]] = Field(default_factory=list, description="The agent's trace steps, in order.")
    tool_calls: list[dict[str, Any]] = Field(
        default_factory=list, description="Tool calls: name, args, status, observation, elapsed_ms (no raw results)."
    )
    memories: list[dict[str, Any]] = Field(
        default_factory=list, description="Memories recalled for the turn: id, source_id, kind, score, text."
    )
    memory_error: str = Field(default="", description="Why recall failed ('' = it did not).")
    context: dict[str, Any] = Field(
        default_factory=dict, description="Context-mode: mode, budget, token breakdown, dropped messages."
    )
    prompt: list[dict[str, str]] = Field(
        default_factory=list,
        description="The prompt of the path's reasoner call, as the model received it (empty: no model was called)."
    )
    usage: dict[str, int] = Field(default_factory=dict, description="prompt_tokens and completion_tokens.")
    timings_ms: dict[str, float] = Field(default_factory=dict, description="recall, images, answer and total.")
    experience: dict[str, Any] | None = Field(default=None, description="The E-CoT record written (segmented path).")
    truncated: bool = Field(default=False, description="True when a text or the prompt was cut to the limits.")


class TraceSummary(StrictModel):
    """One line of the turn list."""

    id: str = Field(description="Trace id (request id).")
    created_at: float = Field(description="Epoch seconds.")
    user: str = Field(description="End user.")
    session_id: str | None = Field(default=None, description="Session id.")
    path: str = Field(description="agent, plain or segmented.")
    route: str | None = Field(default=None, description="direct or tools (agent path).")
    question: str = Field(description="The question, cut to 200 characters.")
    finish_reason: str = Field(description="Why the answer ended.")
    steps: int = Field(description="Trace steps.")
    tool_calls: int = Field(description="Tool calls.")
    total_ms: float | None = Field(default=None, description="Wall time of the turn.")


class TraceSession(StrictModel):
    """A session as seen from its turns: the last turn's context (mode and token breakdown)."""

    session_id: str = Field(description="Session id.")
    user: str = Field(description="Owning user.")
    turns: int = Field(description="Traced turns of the session still kept.")
    last_at: float = Field(description="Time of the last traced turn.")
    last_turn_id: str = Field(description="Trace id of the last turn (its prompt is the last context).")
    mode: str | None = Field(default=None, description="Context mode the last turn ran in.")
    breakdown: dict[str, Any] = Field(default_factory=dict, description="Token breakdown of the last turn.")
