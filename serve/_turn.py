"""Helpers of one chat turn: recall formatting, metadata, and the request's text views.

Kept apart from :mod:`serve.pipeline` so the orchestration reads as the list of steps it runs.
"""

from __future__ import annotations

import time

from serve.api.chat_protocol import ChatCompletionRequest
from serve.engine import ChatMessage
from serve.memory import MemoryHit

__all__ = ["last_user_text", "last_user_images", "memory_message", "memory_meta", "engine_role"]


def last_user_text(req: ChatCompletionRequest) -> str:
    """Text of the last user message (the recall query)."""
    for m in reversed(req.messages):
        if m.role == "user":
            return m.text()
    return ""


def last_user_images(req: ChatCompletionRequest) -> list[str]:
    """Image data URLs of the last user message."""
    for m in reversed(req.messages):
        if m.role == "user":
            return m.images()
    return []


def engine_role(role: str) -> str:
    """OpenAI role -> engine role (``developer`` is the newer name of ``system``)."""
    return "system" if role == "developer" else role


def memory_message(hits: list[MemoryHit], max_chars: int) -> ChatMessage | None:
    """Recalled memories as one system message, most relevant first, within ``max_chars``."""
    lines, used = [], 0
    for i, hit in enumerate(hits, 1):
        when = time.strftime("%Y-%m-%d", time.gmtime(hit.created_at))
        line = f"[{i}] ({hit.kind}, {hit.source_id}, {when}) {hit.text.strip()}"
        if used + len(line) > max_chars:
            break
        lines.append(line)
        used += len(line)
    if not lines:
        return None
    return ChatMessage(role="system", content="Relevant memories (most relevant first; cite them by [n] when used):\n"
                       + "\n".join(lines))


def memory_meta(hits: list[MemoryHit], error: str | None) -> dict[str, object]:
    """Response metadata of the recall step."""
    meta: dict[str, object] = {
        "memories": [{"id": h.id, "source_id": h.source_id, "score": round(h.score, 4)} for h in hits]
    }
    if error is not None:
        meta["memory_error"] = error
    return meta
