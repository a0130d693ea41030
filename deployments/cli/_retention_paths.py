"""``eval retention`` at the engine boundary: the chat pipeline's prompt, and the model's answers.

The retention figures used to score the context the manager assembled, upstream of the serving
path (which then dropped it on the agent path). Here every turn-60 question goes through a real
:class:`~recallserve.serve.pipeline.ChatPipeline` on the chosen path: the turn is built exactly as for an HTTP
request (session, budget, context block, history) and rendered into the prompt of the path's first
reasoner call (:meth:`ChatPipeline.first_prompt`); that prompt, less the question, is what is
scored. No model runs for it: the engine only states its context window.

``--answers N`` then asks the real default model (llama.cpp) the questions of N conversations on
the same path, through :meth:`ChatPipeline.answer` (the session is not written to, so every
question sees the same turn-59 session), and scores the answers: an item counts when every one of
its keys is in the answer.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

from recallserve.serve.api.chat_protocol import ChatCompletionRequest
from recallserve.serve.api.errors import APIError
from recallserve.serve.context import ContextBudgetError, ContextManager, Session
from recallserve.serve.context._retention import EVAL_SYSTEM, PromptFn, item_present
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, EngineError, GenerationParams, LLMEngine
from recallserve.serve.pipeline import ChatPipeline, PipelineSettings, RequestContext

__all__ = ["PATHS", "pipeline_prompt_fn", "score_answers"]

#: Chat paths whose prompt is scored: the agent (the default path) and plain chat (agent off).
PATHS = ("agent", "plain")


class _PromptOnly:
    """Engine facts without a model: its context window (what the budget is computed from).

    Only prompts are rendered with it; a generation call is an error, never a made-up reply.
    """

    model_name = "prompt-only"

    def __init__(self, context_window: int) -> None:
        self.context_window = context_window

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        raise EngineError("the prompt-only engine does not generate")

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        raise EngineError("the prompt-only engine does not generate")
        yield  # pragma: no cover - makes this an async generator

    async def count_tokens(self, text: str) -> int:
        raise EngineError("the prompt-only engine has no tokenizer")

    async def close(self) -> None:
        return None


def _pipeline(engine: LLMEngine, manager: ContextManager, path: str, reserved_output: int) -> ChatPipeline:
    from recallserve.serve.agent import Agent, AgentConfig, default_registry

    agent = None
    if path == "agent":
        # NOTE: cpu-local's agent: rules first, no router model.
        agent = Agent(engine, default_registry(demo=True), config=AgentConfig(use_router=False, max_steps=3))
    # NOTE: the server's max_tokens limit is raised to the reserve under test (003's 2,000 is above
    # the default 1,024), so --reserved-output measures the reserve, not the limit.
    limit = max(PipelineSettings.model_fields["max_request_tokens"].default, reserved_output)
    settings = PipelineSettings(write_back=False, max_request_tokens=limit)
    return ChatPipeline(engine, settings, context=manager, agent=agent)


def _request(session: Session, question: str, mode: str, reserved_output: int) -> tuple[ChatCompletionRequest,
                                                                                         RequestContext]:
    req = ChatCompletionRequest.model_validate({
        "model": "recallserve", "user": session.user, "max_tokens": reserved_output, "temperature": 0,
        "metadata": {"session_id": session.id, "context_mode": mode},
        "messages": [{"role": "system", "content": EVAL_SYSTEM}, {"role": "user", "content": question}]})
    return req, RequestContext(tenant=session.tenant, user=session.user)


def pipeline_prompt_fn(managers: dict[str, ContextManager], path: str, reserved_output: int) -> PromptFn:
    """The prompt function of :func:`recallserve.serve.context._retention.evaluate_retention` for ``path``.

    Args:
        managers: session id -> the manager its conversation was replayed with.
        path: ``agent`` or ``plain``.
        reserved_output: the request's ``max_tokens``.
    """
    async def prompt(session: Session, question: str, budget: int, mode: str) -> tuple[str, str, float]:
        pipeline = _pipeline(_PromptOnly(budget), managers[session.id], path, reserved_output)  # type: ignore[arg-type]
        req, ctx = _request(session, question, mode, reserved_output)
        start = time.perf_counter()
        try:
            turn, _ = await pipeline.build_turn(req, ctx)
        except APIError as exc:
            if exc.code == "context_budget_exceeded":
                raise ContextBudgetError(exc.message, budget=budget, required=budget) from None
            raise
        latency = (time.perf_counter() - start) * 1e3
        messages = pipeline.first_prompt(req, ctx, turn)
        # NOTE: the question's own text is not context: the last user message keeps only what
        # precedes "Question:" (the recalled memories, none here).
        last = messages[-1].content.rsplit("Question:", 1)[0]
        context = "\n".join([*(m.content for m in messages[:-1]), last])
        assert turn.report is not None  # NOTE: build_turn always reports what context-mode did
        return context, turn.report.mode, latency

    return prompt


async def score_answers(conversations: Sequence[Any], managers: Sequence[ContextManager],
                        sessions: Sequence[Session], engine: LLMEngine, *, path: str, mode: str,
                        reserved_output: int, on_item: Any = None) -> dict[str, Any]:
    """Ask ``engine`` every item's turn-60 question on ``path`` and score the answers."""
    rows = []
    for conv, manager, session in zip(conversations, managers, sessions):
        pipeline = _pipeline(engine, manager, path, reserved_output)
        for item in conv.items:
            req, ctx = _request(session, item.question, mode, reserved_output)
            start = time.perf_counter()
            turn, params = await pipeline.build_turn(req, ctx)
            answer = await pipeline.answer(req, ctx, turn, params)
            rows.append({"seed": conv.seed, "kind": item.kind, "question": item.question,
                         "answer": answer.text, "present": item_present(item, answer.text),
                         "prompt_tokens": answer.prompt_tokens, "seconds": round(time.perf_counter() - start, 1)})
            if on_item is not None:
                on_item()
    n = len(rows)
    return {"path": path, "mode": mode, "budget": engine.context_window, "items": n,
            "present_share": round(sum(r["present"] for r in rows) / n, 4) if n else 0.0,
            "prompt_tokens_mean": round(sum(r["prompt_tokens"] for r in rows) / n, 1) if n else 0.0,
            "rows": rows}
