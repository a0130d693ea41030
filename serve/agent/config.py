"""Configuration of the agent loop (one ``StrictModel``; loaded from the serve profile).

Defaults follow the CoT 3.0 seed: max 5 steps, a 5-minute result cache, summarised and capped
observations. Recall (how many memories, shown how) is the turn's, not the agent's: see
:class:`recallserve.serve.turn.RecallConfig` and the profile's ``memory.top_k``; the history the agent sees is
what the token budget kept (context-mode), not a count of its own.
"""

from __future__ import annotations

from pydantic import Field

from recallserve.kernels import StrictModel

__all__ = ["AgentConfig"]


class AgentConfig(StrictModel):
    """Knobs of :class:`recallserve.serve.agent.Agent`; every one bounded."""

    max_steps: int = Field(default=5, ge=1, le=10, description="Reasoner steps before a partial answer.")
    step_max_tokens: int = Field(
        default=320, ge=32, le=4096, description="Most tokens one reasoner step (JSON reply) may generate."
    )
    router_max_tokens: int = Field(default=64, ge=16, le=512, description="Most tokens of the router's JSON decision.")
    temperature: float = Field(
        default=0.0, ge=0.0, le=2.0, description="Sampling temperature of router and reasoner (0 = greedy); a request's own "
        "temperature replaces it in the answering calls (steps, direct answers)."
    )
    seed: int | None = Field(default=0, description="Sampling seed passed to the engines (a request's own seed replaces "
                             "it in the answering calls).")
    routing_rules: bool = Field(
        default=True,
        description="Decide first from the tools' routing hints (serve.agent.routing); the router model is asked "
        "only when the rules are undecided.",
    )
    check_ids: bool = Field(
        default=True,
        description="Stop an answer at the first id (T-1071, B-2207, 104208) that neither the question, the "
        "memories nor the observations hold, and keep it up to the sentence before (serve.agent.guards.AnswerCheck).",
    )
    stop_repeats: bool = Field(
        default=True,
        description="Stop an answer at the first sentence that repeats an earlier one word for word (greedy decoding "
        "cannot leave such a loop) and keep it up to that sentence (serve.agent.guards.AnswerCheck).",
    )
    check_absence: bool = Field(
        default=True,
        description="Leave out an answer sentence claiming that something did not happen, does not exist or is not "
        "on record unless a search of the turn came back empty for it, and say so when no search ran; likewise a "
        "sentence claiming an earlier case of a fault code (E31) that no search of the turn found on any record "
        "(serve.agent.grounding).",
    )
    quote_record: bool = Field(
        default=True,
        description="After the answer to a question about earlier cases or a fix, quote the best recalled record that "
        "names the question's ids and codes (its fault and fix in its own words; serve.agent.grounding.record_note).",
    )
    rule_replies: bool = Field(
        default=True,
        description="When the rules alone settle a direct answer (a malformed id, an action outside the tenant's "
        "scopes), reply with their fixed text instead of asking the model (which may contradict the rule); "
        "False = the model answers, advised by the rule.",
    )
    rule_first_call: bool = Field(
        default=True,
        description="When the rules fix the first step's call completely (one tool, every argument given once in "
        "the question), run it without a reasoner step; the model starts at the observation. False = the model "
        "writes step 1 (a thought and the same call).",
    )
    use_router: bool = Field(
        default=True,
        description="Ask the router model whether to answer directly or use tools (when the rules are off or "
        "undecided); False = run the loop with every tool.",
    )
    allow_parallel_calls: bool = Field(
        default=True,
        description="Offer the model the multi-call step {type: tool_calls, calls: [...]} (run in parallel).",
    )
    model_partial_answer: bool = Field(
        default=True,
        description="Out of steps: ask the model for a final answer stating what is known and missing "
        "(False: compose it from the observations without another engine call).",
    )
    observation_max_chars: int = Field(
        default=700, ge=40, le=16000, description="Cap on one summarised observation shown to the model."
    )
    cache_ttl_s: float = Field(default=300.0, ge=0.0, le=86400.0, description="TTL of cached tool and retrieval results.")
    cache_max_entries: int = Field(default=2048, ge=1, le=1_000_000, description="Entries kept by the TTL cache (LRU).")
    engine_timeout_s: float = Field(default=120.0, gt=0.0, le=3600.0, description="Timeout of one engine call.")
    request_timeout_s: float = Field(
        default=300.0, gt=0.0, le=7200.0, description="Deadline of the whole loop; then a partial answer."
    )
