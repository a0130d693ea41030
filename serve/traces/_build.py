"""Build the stored trace of one answered turn: gather, cut to size, mask personal data."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

from recallserve.serve.engine import ChatMessage
from recallserve.serve.pii import SESSION_KEY_CHARS, apply_pii, mask_id
from recallserve.serve.traces._models import TURN_ID_CHARS, TraceConfig, TurnTrace
from recallserve.serve.turn import Turn

__all__ = ["build_trace"]

_CUT = " [...cut]"
#: Most steps, tool calls or memories kept in one trace (the agent's own limits are far below).
MAX_ITEMS = 100


class _Cutter:
    """Cuts texts to the config's sizes and remembers whether it cut anything."""

    def __init__(self, config: TraceConfig) -> None:
        self.config = config
        self.cut = False

    def text(self, value: str, limit: int | None = None) -> str:
        limit = self.config.text_chars if limit is None else limit
        if len(value) <= limit:
            return value
        self.cut = True
        return value[: max(0, limit - len(_CUT))] + _CUT

    def deep(self, value: Any) -> Any:
        """Every string inside ``value`` (dicts, lists) cut to ``text_chars``, every list and dict to
        :data:`MAX_ITEMS` entries."""
        if isinstance(value, str):
            return self.text(value)
        if isinstance(value, (dict, list, tuple)) and len(value) > MAX_ITEMS:
            self.cut = True
        if isinstance(value, dict):
            return {k: self.deep(v) for k, v in list(value.items())[:MAX_ITEMS]}
        if isinstance(value, (list, tuple)):
            return [self.deep(v) for v in value[:MAX_ITEMS]]
        return value

    def prompt(self, messages: Sequence[ChatMessage]) -> list[dict[str, str]]:
        """The messages, the later ones cut first once ``prompt_chars`` (all messages) is reached."""
        left = self.config.prompt_chars
        out = []
        for m in messages:
            content = self.text(m.content, max(left, 0))
            left -= len(content)
            out.append({"role": m.role, "content": content})
        return out


def build_trace(turn: Turn, *, request_id: str, user: str, path: str, stream: bool, answer: str, finish: str,
                prompt_tokens: int, completion_tokens: int, prompt: Sequence[ChatMessage],
                agent_meta: dict[str, Any] | None, started: float, config: TraceConfig,
                experience: dict[str, Any] | None = None) -> TurnTrace:
    """The trace of ``turn``: its question and answer, the agent's route, steps and tool calls
    (``agent_meta`` = ``AgentResult.metadata()``, raw tool results already left out), the recalled
    memories, the context-mode figures, the prompt the turn rendered for its reasoner (every loop
    call extends it), the segmented path's ``experience`` figures and the timings.

    Every string is cut to ``config.text_chars`` (the prompt to ``config.prompt_chars`` in all)
    and then masked by :func:`recallserve.serve.pii.apply_pii` (``mask``, whatever the tenant's policy: the
    trace is the operator's view, as the logs are).
    """
    cutter = _Cutter(config)
    agent_meta = agent_meta or {}
    memories = [{"id": h.id, "source_id": h.source_id, "kind": h.kind, "score": round(h.score, 4),
                 "similarity": round(h.similarity, 4), "time_factor": round(h.time_factor, 4), "text": h.text}
                for h in turn.memories]
    timings = turn.timings.as_dict()
    timings["total"] = round((time.perf_counter() - started) * 1e3, 2)
    if "elapsed_ms" in agent_meta:
        timings["agent"] = round(float(agent_meta["elapsed_ms"]), 2)
    raw: dict[str, Any] = {
        "path": path, "stream": stream, "question": turn.question, "answer": answer, "finish_reason":
        str(agent_meta.get("finish_reason") or finish), "route": agent_meta.get("route"),
        "steps": agent_meta.get("steps") or [], "tool_calls": agent_meta.get("tool_calls") or [],
        "memories": memories, "memory_error": turn.memory_error, "context": turn.report.model_dump(mode="json") if turn.report is not None else {},
        "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens},
        "timings_ms": timings, "experience": experience,
    }
    raw = cutter.deep(raw)
    # NOTE: ids are never cut (a request id may be 128 characters), only masked.
    raw.update(id=request_id, created_at=time.time(), user=user,
               session_id=turn.session.id if turn.session is not None else None)
    raw["prompt"] = cutter.prompt(prompt)
    raw["truncated"] = cutter.cut
    masked = apply_pii(raw, "mask")
    # NOTE: memory ids are the server's hex keys; a run of hex digits can pass a masker's check
    # (an IBAN's mod-97), and a masked id opens nothing.
    for item, hit in zip(masked["memories"], turn.memories):
        item["id"] = hit.id
    # NOTE: the session id and user are keys (``GET /v1/turns?session_id=``): masked to distinct
    # keys (a masked one, as a masking tenant's turn has, is unchanged), never to a shared [EMAIL].
    masked["user"] = mask_id(user)
    # NOTE: the request id is the trace's key: masked to a distinct key, never to a bare tag (two
    # card-like request ids were one "[CARD_NUMBER]" row, the first trace replaced by the second).
    masked["id"] = mask_id(request_id, TURN_ID_CHARS)
    # The session id at the session store's length (serve.api.app keys a masking tenant's session so),
    # the length ``GET /v1/turns?session_id=`` looks it up at.
    masked["session_id"] = mask_id(raw["session_id"], SESSION_KEY_CHARS) if raw["session_id"] is not None else None
    return TurnTrace.model_validate(masked)
