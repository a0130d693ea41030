"""Schemas of context-mode: messages, sessions, configuration, the assembled result, errors.

Every schema is a :class:`~kernels.StrictModel` so the ingress can put a
:class:`ContextResult`'s metadata in a response and a YAML profile can carry a
:class:`ContextConfig` without a hand-written validator.
"""

from __future__ import annotations

import time
import uuid
from typing import Any, Literal

from pydantic import Field, model_validator

from recallserve.kernels import StrictModel
from recallserve.serve.engine import ChatMessage

__all__ = [
    "Role",
    "Category",
    "ModeName",
    "ResolvedMode",
    "MessageIn",
    "Message",
    "Session",
    "SummaryState",
    "ContextConfig",
    "TokenBreakdown",
    "AutoSignals",
    "ContextResult",
    "ContextError",
    "ContextBudgetError",
    "SessionNotFoundError",
    "DEFAULT_RETENTION",
    "default_retention",
]

Role = Literal["system", "user", "assistant", "tool"]
Category = Literal["chat", "constraint", "fact", "tool_result", "greeting"]
ModeName = Literal["full", "sliding", "summary", "retrieval", "hybrid", "auto"]
ResolvedMode = Literal["full", "sliding", "summary", "retrieval", "hybrid"]

# NOTE: 003's levels: system constraints 3 (never dropped), the user's explicit instructions 2
# (kept as long as possible), tool results and facts 1 (kept as needed), greetings 0 (dropped
# first). A user's constraints and facts are carried into that user's next session whatever their
# level. Retention 3 comes only from a system message (:func:`default_retention`).
DEFAULT_RETENTION: dict[str, int] = {
    "constraint": 2,
    "fact": 1,
    "chat": 1,
    "tool_result": 1,
    "greeting": 0,
}


def default_retention(category: Category, role: str) -> int:
    """003's retention of a message: 3 for a system constraint, else :data:`DEFAULT_RETENTION` of its category.

    Example:
        >>> default_retention("constraint", "system"), default_retention("constraint", "user"), default_retention("fact", "user")
        (3, 2, 1)
    """
    return 3 if category == "constraint" and role == "system" else DEFAULT_RETENTION[category]


class ContextError(Exception):
    """Base class of context-mode errors."""


class ContextBudgetError(ContextError):
    """The never-drop part of the context does not fit the budget; the request must be refused.

    Attributes:
        budget: tokens left for history after system, reserved output and pending messages.
        required: tokens the retention-3 messages need.
    """

    def __init__(self, message: str, *, budget: int, required: int) -> None:
        super().__init__(message)
        self.budget = budget
        self.required = required


class SessionNotFoundError(ContextError, KeyError):
    """No session with this id for this tenant and user (other owners' sessions look absent)."""

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0]) if self.args else "session not found"


class MessageIn(StrictModel):
    """A message as the caller hands it in; category and retention are inferred when left out."""

    role: Role = Field(description="Author role.")
    content: str = Field(min_length=1, max_length=200_000, description="Plain-text content.")
    category: Category | None = Field(default=None, description="Forced category; None = classify.")
    retention: int | None = Field(default=None, ge=0, le=3, description="Forced retention 0..3; None = from category.")
    tool_name: str | None = Field(default=None, max_length=128, description="Tool that produced a tool message.")
    timestamp: float | None = Field(default=None, ge=0, description="Epoch seconds; None = now.")


class Message(StrictModel):
    """One stored message of a session."""

    id: str = Field(default_factory=lambda: uuid.uuid4().hex, description="Message id (unique).")
    seq: int = Field(default=-1, ge=-1, description="Position in the session, 0-based (-1 = not stored yet).")
    role: Role = Field(description="Author role.")
    content: str = Field(description="Plain-text content.")
    timestamp: float = Field(default_factory=time.time, ge=0, description="Epoch seconds.")
    category: Category = Field(default="chat", description="What kind of content this is.")
    retention: int = Field(default=1, ge=0, le=3, description="0 may drop .. 3 never drop.")
    tokens: int = Field(default=0, ge=0, description="Token count of the content (with per-message overhead).")
    tool_name: str | None = Field(default=None, description="Tool that produced a tool message.")
    source_session: str | None = Field(
        default=None, description="Set on messages carried over from the user's earlier session."
    )


class SummaryState(StrictModel):
    """The rolling summary of a session and when it was last refreshed."""

    text: str = Field(default="", description="Summary text ('' = none yet).")
    until_seq: int = Field(default=-1, ge=-1, description="Last message seq the summary covers (-1 = none).")
    updated_at: float = Field(default=0.0, ge=0, description="Epoch seconds of the last refresh (0 = never).")
    tokens: int = Field(default=0, ge=0, description="Token count of the summary text.")
    summariser: str = Field(default="", description="Which summariser wrote it (model name or 'extractive').")


class Session(StrictModel):
    """A conversation owned by one tenant and one user."""

    id: str = Field(min_length=1, max_length=128, description="Session id.")
    tenant: str = Field(min_length=1, max_length=128, description="Owning tenant.")
    user: str = Field(min_length=1, max_length=128, description="Owning user.")
    created_at: float = Field(ge=0, description="Epoch seconds.")
    mode: ModeName | None = Field(default=None, description="Session default mode; None = the config default.")
    message_count: int = Field(default=0, ge=0, description="Messages stored so far.")
    summary: SummaryState = Field(default_factory=SummaryState, description="Rolling summary.")


class ContextConfig(StrictModel):
    """Knobs of context assembly and of the rolling summary.

    Defaults follow the context-mode seed (003): full below a history/context-window ratio of 0.4,
    sliding below a fact density of 0.2 (over the session's user messages: a measured departure), summary batches of at most 4000 tokens triggered at 12000
    unsummarised tokens with a cooldown of 30 minutes or 20 messages.
    """

    default_mode: ModeName = Field(default="auto", description="Mode when neither request nor session sets one.")
    full_ratio: float = Field(default=0.4, gt=0, le=1, description="auto: history/context window below this -> full.")
    sliding_fact_density: float = Field(
        default=0.2, ge=0, le=1,
        description="auto: share of the session's user messages that are constraints/facts below this -> sliding.",
    )
    discreteness_threshold: float = Field(
        default=0.55, ge=0, le=1,
        description="auto: 1 - mean cosine of consecutive recent user queries at or above this -> hybrid.",
    )
    discreteness_queries: int = Field(default=4, ge=2, le=32, description="auto: recent user queries compared.")
    recent_min_messages: int = Field(
        default=4, ge=0, le=64, description="Recent window keeps at least this many messages when they fit."
    )
    entity_share: float = Field(
        default=0.15, ge=0, le=1, description="Most of the history budget the entity table may take."
    )
    summary_share: float = Field(
        default=0.25, ge=0, le=1, description="Most of the history budget the summary may take."
    )
    retrieved_share: float = Field(
        default=0.25, ge=0, le=1, description="Most of the history budget retrieved turns may take (hybrid)."
    )
    retrieval_k: int = Field(default=8, ge=1, le=100, description="Most past messages retrieved.")
    retrieval_threshold: float = Field(
        default=0.25, ge=-1, le=1, description="Least cosine similarity of a retrieved message."
    )
    summary_trigger_tokens: int = Field(default=12000, ge=1, description="Unsummarised tokens that trigger a summary.")
    summary_batch_tokens: int = Field(default=4000, ge=256, le=4000, description="Most tokens per summariser call.")
    summary_cooldown_s: float = Field(default=1800.0, ge=0, description="Cooldown between summaries, seconds.")
    summary_cooldown_messages: int = Field(
        default=20, ge=0, description="... or this many new messages, whichever first."
    )
    summary_keep_recent: int = Field(
        default=8, ge=0, description="Newest messages never summarised (they stay verbatim)."
    )
    summary_max_tokens: int = Field(default=600, ge=32, le=4000, description="Most tokens of the summary text.")
    carry_over_items: int = Field(
        default=50, ge=0, le=1000, description="Most user constraints/facts carried into a new session."
    )
    # NOTE: every distinct id, amount or date a client sends is a row of the session's entity table,
    # read back on every turn; without a bound one session grew it without end. 2,000 rows is far
    # more than the entity_share of any context window shows (~10 tokens a line), and a few hundred KB.
    max_entities_per_session: int = Field(
        default=2000, ge=1, le=100_000,
        description="Most entities a session's table keeps; past it the least recently seen are evicted.",
    )

    @model_validator(mode="after")
    def _shares_fit(self) -> ContextConfig:
        total = self.entity_share + self.summary_share + self.retrieved_share
        if total > 0.9:
            raise ValueError(
                f"entity_share + summary_share + retrieved_share must be <= 0.9 (got {total:.2f}): "
                "the recent window needs the rest"
            )
        return self


class TokenBreakdown(StrictModel):
    """Tokens of each part of the assembled context (the parts sum to ``total``)."""

    system: int = Field(default=0, ge=0, description="Caller's system prompt plus the context block's framing.")
    constraints: int = Field(default=0, ge=0, description="Pinned retention-3 messages outside the recent window.")
    entities: int = Field(default=0, ge=0, description="Entity table.")
    summary: int = Field(default=0, ge=0, description="Rolling summary.")
    recent: int = Field(default=0, ge=0, description="Recent window (verbatim newest messages).")
    retrieved: int = Field(default=0, ge=0, description="Past messages retrieved by similarity.")
    pending: int = Field(default=0, ge=0, description="The request's new messages.")
    total: int = Field(
        default=0, ge=0,
        description="Sum of the parts. From context-mode alone: its share of a prompt (system text with the block, "
        "window, pending); in a chat turn's metadata: the tokens of the prompt the engine receives.")


class AutoSignals(StrictModel):
    """What ``auto`` looked at (also reported for explicit modes, for tuning)."""

    history_ratio: float = Field(ge=0, description="History tokens / context window.")
    fact_density: float = Field(ge=0, le=1, description="Share of the session's user messages that are constraints or facts.")
    discreteness: float | None = Field(
        default=None, description="1 - mean cosine of consecutive recent user queries (None = no embedder / too few)."
    )
    reason: str = Field(description="Why this mode, in words.")


class ContextResult(StrictModel):
    """What context-mode gives one request's prompt (its block and window), with its accounting.

    No whole prompt: the caller renders the block and window under its own head (the chat turn:
    :func:`recallserve.serve.turn.render_prompt`), so nothing here is built to be thrown away.
    """

    session_id: str = Field(description="Session the context belongs to.")
    block: str = Field(default="", description="The conversation-memory block of the system message ('' in full mode).")
    window: list[ChatMessage] = Field(
        default_factory=list, description="History messages kept verbatim, oldest first (pending excluded)."
    )
    mode: ResolvedMode = Field(description="Mode used.")
    requested_mode: ModeName = Field(description="Mode asked for (request, session or config default).")
    budget: int = Field(ge=0, description="History budget = context_window - reserved_output - system - pending.")
    breakdown: TokenBreakdown = Field(description="Tokens per part.")
    signals: AutoSignals = Field(description="The signals auto mode decides on.")
    dropped_messages: int = Field(ge=0, description="History messages left out (covered by summary or dropped).")
    summary_covers_until: int = Field(ge=-1, description="Last message seq the rolling summary covers (-1 = none).")
    latency_ms: float = Field(ge=0, description="Assembly time, milliseconds.")

    def response_metadata(self) -> dict[str, Any]:
        """Everything but the messages, JSON-ready: what the ingress puts in the response metadata."""
        return self.model_dump(mode="json", exclude={"block", "window"})
