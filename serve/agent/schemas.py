"""Input and output types of the agent: the request, the trace, the result, the stream events.

The chat pipeline turns an OpenAI ``ChatCompletionRequest`` into a :class:`~recallserve.serve.turn.Turn`
(the conversation) and an :class:`AgentRequest` (who asks, scopes, mode, sampling), and puts
:class:`AgentResult` fields into the response (``answer`` as the message, the rest as metadata).
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.serve.engine import ChatMessage
from recallserve.serve.memory import MemoryWrite

__all__ = [
    "AgentRequest",
    "RouteDecision",
    "ToolCallRecord",
    "TraceStep",
    "AgentUsage",
    "AgentResult",
    "AgentEvent",
]


class AgentRequest(StrictModel):
    """What one agent run needs besides its turn: who asks, what they may use, how to sample.

    The conversation itself is the :class:`~recallserve.serve.turn.Turn` the pipeline built.
    """

    tenant: str = Field(min_length=1, max_length=256, description="Tenant (user) id; memories are scoped to it.")
    scopes: list[str] = Field(
        default_factory=lambda: ["basic", "memory:read"],
        description="Permission scopes of the tenant; only tools whose scope is listed are offered.",
    )
    mode: Literal["auto", "on", "off"] = Field(
        default="auto", description="auto: the router decides; on: always the tool loop; off: answer without tools."
    )
    user: str | None = Field(default=None, min_length=1, max_length=128,
                             description="End user's stored key: the memory tool sees only their memories and the "
                                         "tenant's unowned ones (None: the whole tenant's).")
    session_id: str | None = Field(default=None, max_length=256, description="Session id stored with write-backs.")
    max_steps: int | None = Field(default=None, ge=1, le=10, description="Override of AgentConfig.max_steps.")
    max_answer_tokens: int | None = Field(
        default=None, ge=1, le=32768, description="Most tokens of a direct (no-tool) answer (default: step_max_tokens)."
    )
    pii: Literal["mask", "reject", "allow"] = Field(
        default="mask", description="PII policy of the tenant: write-backs are masked unless it is 'allow'.")
    # NOTE: the client's sampling options (a chat request's temperature, top_p, seed, penalties): the loop's
    # steps and a direct answer, which write the answer, sample with them; the router (a
    # classification) keeps the agent's own. They were dropped in silence on the agent path.
    temperature: float | None = Field(default=None, ge=0.0, le=2.0,
                                      description="Sampling temperature of the answering calls (None: AgentConfig's).")
    top_p: float | None = Field(default=None, gt=0.0, le=1.0, description="Nucleus mass of the answering calls (None: the engine default).")
    seed: int | None = Field(default=None, ge=-(2**63), le=2**63 - 1,
                             description="Sampling seed of the answering calls (None: AgentConfig's).")
    presence_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, description="Presence penalty of the answering calls.")
    frequency_penalty: float = Field(default=0.0, ge=-2.0, le=2.0, description="Frequency penalty of the answering calls.")


class RouteDecision(StrictModel):
    """The router's decision for one request."""

    route: Literal["direct", "tools"] = Field(description="direct: answer without tools; tools: run the loop.")
    tools: list[str] = Field(default_factory=list, description="Tools the loop may call (subset of the tenant's).")
    source: Literal["rules", "router", "mode", "fallback", "no_tools"] = Field(
        description="Who decided: the routing rules, the router model, the request mode, a fallback after a bad "
        "router reply, or no tools being allowed."
    )
    first_step: list[str] = Field(
        default_factory=list, description="The first step must call one of these (rules only; empty = free)."
    )
    bindings: dict[str, dict[str, list[str]]] = Field(
        default_factory=dict, description="Rules only: tool -> argument -> the values found in the question."
    )
    reason: str = Field(default="", description="Why the rules decided so (empty for the router model).")
    advice: str = Field(default="", description="Rules only, direct route: what the answer must do.")
    reply: str = Field(default="", description="Rules only, direct route: the fixed reply (no model call).")
    elapsed_ms: float = Field(default=0.0, ge=0.0, description="Time the decision took.")


class ToolCallRecord(StrictModel):
    """One tool call the model asked for, and what came of it."""

    id: str = Field(description="Call id within the run (c1, c2, ...).")
    step: int = Field(ge=1, description="Loop step that asked for it.")
    name: str = Field(description="Tool name as asked.")
    args: dict[str, Any] = Field(default_factory=dict, description="Arguments as asked (after validation when ok).")
    status: Literal["ok", "invalid", "refused", "error", "timeout", "cached"] = Field(
        description="ok/cached: ran (or came from the cache); invalid: failed validation; refused: unknown, "
        "out of scope or repeated; error/timeout: the tool failed."
    )
    observation: str = Field(description="The summarised observation given back to the model.")
    elapsed_ms: float = Field(default=0.0, ge=0.0, description="Wall time of the call.")
    result: Any = Field(default=None, description="Raw tool result (JSON-able) when status is ok/cached.")


class TraceStep(StrictModel):
    """One entry of the reasoning trace."""

    step: int = Field(ge=0, description="Loop step (0 = before the loop: memory, router, images).")
    kind: Literal["memory", "image", "route", "thought", "action", "observation", "parse_error", "guard", "final",
                  "partial"] = Field(description="What happened (guard: the answer was cut before an invented id or a repeated sentence).")
    content: str = Field(description="Human-readable content.")
    elapsed_ms: float = Field(default=0.0, ge=0.0, description="Time it took, where measured.")
    data: dict[str, Any] = Field(default_factory=dict, description="Structured details.")


class AgentUsage(StrictModel):
    """Tokens over every engine call of the run."""

    prompt_tokens: int = Field(default=0, ge=0, description="Prompt tokens, summed over engine calls.")
    cached_tokens: int = Field(
        default=0, ge=0, description="Of those, tokens the engines reused from their prefix caches (not evaluated)."
    )
    completion_tokens: int = Field(default=0, ge=0, description="Generated tokens, summed over engine calls.")
    engine_calls: int = Field(default=0, ge=0, description="Engine calls made (router, steps, retries).")
    engine_ms: float = Field(default=0.0, ge=0, description="Milliseconds the engines worked on those calls.")


class AgentResult(StrictModel):
    """The outcome of :meth:`recallserve.serve.agent.Agent.run`."""

    answer: str = Field(description="The final answer (or the partial answer).")
    finish_reason: Literal["final", "direct", "max_steps", "timeout", "engine_error"] = Field(
        description="final: the model answered in the loop; direct: no loop; max_steps/timeout/engine_error: "
        "a partial answer."
    )
    partial: bool = Field(default=False, description="True when the answer is partial.")
    cut_by_length: bool = Field(default=False, description="A direct answer stopped at the client's max_tokens.")
    route: RouteDecision = Field(description="The router's decision.")
    steps: list[TraceStep] = Field(default_factory=list, description="The trace, in order.")
    tool_calls: list[ToolCallRecord] = Field(default_factory=list, description="Every tool call asked for.")
    memory_hits: list[dict[str, Any]] = Field(default_factory=list, description="Recalled memories (id, score, text).")
    usage: AgentUsage = Field(default_factory=AgentUsage, description="Token usage.")
    elapsed_ms: float = Field(default=0.0, ge=0.0, description="Wall time of the run.")
    first_token_ms: float | None = Field(default=None, description="Time to the first answer character, when streamed.")
    memory_writes: list[MemoryWrite] = Field(
        default_factory=list, description="PII-masked memories to write off the request path (Agent.write_back)."
    )
    prompt: list[ChatMessage] = Field(
        default_factory=list,
        description="What the reasoner call received before any step was appended (the turn trace stores it).")
    searches: list[dict[str, Any]] = Field(
        default_factory=list,
        description="The turn's record of searches (serve.agent.grounding.turn_searches): source, whether it ran, "
        "what it found (texts, each cut to 300 characters).")

    def openai_finish(self) -> Literal["stop", "length"]:
        """The OpenAI ``finish_reason`` of the answer.

        NOTE: it was "stop" whatever happened: a direct answer cut at max_tokens told an SDK client
        (which checks for "length" to ask for more) that the answer was complete.
        """
        return "length" if self.cut_by_length else "stop"

    def metadata(self) -> dict[str, Any]:
        """The response metadata: route, trace, tool calls, usage (no raw tool results)."""
        return {
            "route": self.route.model_dump(),
            "finish_reason": self.finish_reason,
            "partial": self.partial,
            "steps": [s.model_dump() for s in self.steps],
            "tool_calls": [c.model_dump(exclude={"result"}) for c in self.tool_calls],
            "memory_hits": self.memory_hits,
            "usage": self.usage.model_dump(),
            "elapsed_ms": self.elapsed_ms,
            "searches": [{"source": s["source"], "ran": s["ran"], "found": len(s["found"])} for s in self.searches],
        }


class AgentEvent(StrictModel):
    """One streamed event: a trace step, a piece of the answer, or the end with the result."""

    type: Literal["trace", "answer_delta", "done"] = Field(description="Event kind.")
    step: TraceStep | None = Field(default=None, description="For type=trace.")
    text: str = Field(default="", description="For type=answer_delta: new answer text.")
    result: AgentResult | None = Field(default=None, description="For type=done.")
