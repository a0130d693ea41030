"""Rolling summary: when to refresh it, how to batch the messages, and two summarisers.

* :class:`LLMSummariser` asks a chat model (the summariser deployment, any
  :class:`~recallserve.serve.engine.LLMEngine`) to fold a batch of messages into the running summary.
* :class:`ExtractiveSummariser` needs no model: it carries the constraint and fact messages
  over verbatim and notes tool uses; fast and deterministic (tests, ``--no-llm-summary``, and
  the fallback when no summariser is configured).

Both see the same rendering of a batch, in which a tool result is reduced to *which question it
answered and when* - tool outputs are never summarised as facts (they may be stale, partial or
injected). The model prompt keeps full names with titles and never merges two entities.

Trigger (see :func:`summary_candidates`): the messages not yet covered, minus the newest
``summary_keep_recent`` (which stay verbatim in the recent window), are summarised when they hold
at least ``summary_trigger_tokens`` tokens and the cooldown has passed: ``summary_cooldown_s``
since the last refresh, or ``summary_cooldown_messages`` new messages, whichever comes first.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol, runtime_checkable

from recallserve.serve.context._types import ContextConfig, Message, Session
from recallserve.serve.engine import ChatMessage, GenerationParams, LLMEngine
from recallserve.serve.language import language_of
from recallserve.serve.tokens import TiktokenCounter, TokenCounter

__all__ = [
    "Summariser",
    "LLMSummariser",
    "ExtractiveSummariser",
    "summary_candidates",
    "plan_batches",
    "render_messages",
    "SUMMARY_PROMPT",
    "SUMMARY_PROMPT_ZH",
]

# NOTE: tokens the summariser prompt's instructions and framing take, reserved when packing a
# batch so that instructions + previous summary + batch stay within summary_batch_tokens.
_PROMPT_OVERHEAD = 300
# NOTE: per rendered line: "[2026-03-01 10:02] user (constraint): " is ~14 cl100k tokens.
_LINE_OVERHEAD = 16
_QUESTION_CHARS = 160

SUMMARY_PROMPT = """You maintain the running summary of a customer-service conversation.
Rules:
1. Keep every person's full name with its title exactly as written (e.g. "Dr. Maria Jose Alvarez-Lopez"). Never shorten a name, never merge two people, orders, accounts or products into one.
2. Copy order ids, ticket ids, amounts, dates, times and numbers verbatim.
3. Keep every constraint or preference the user stated (never / always / must / only / budget / deadline) as its own bullet, close to the user's words.
4. Tool uses are not facts: for a tool use record only which question it answered and when.
5. Lines marked "pinned" are kept verbatim elsewhere: mention them in a few words at most.
6. Drop greetings and small talk. Keep what was decided, promised or is still open.
Answer with bullet points only ("- ..."), the previous summary's bullets updated, at most {words} words."""
#: Appended to :data:`SUMMARY_PROMPT` when the conversation is Chinese (:func:`~recallserve.serve.language.language_of`
#: of the batch and the previous summary): the summary is written in the conversation's language, so
#: names such as 张总 and rules such as 必须用人民币 are copied, not translated.
SUMMARY_PROMPT_ZH = """
7. The conversation is in Chinese: write the summary in Chinese (简体中文), copying names with titles (e.g. 张总, 李经理), amounts (e.g. 5万元) and dates (e.g. 下周三) exactly; count each Chinese character as one word."""


@runtime_checkable
class Summariser(Protocol):
    """Folds a batch of rendered messages into the running summary."""

    name: str

    async def summarise(self, previous: str, lines: Sequence[str], max_tokens: int) -> str:
        """The updated summary (bullet lines) of ``previous`` plus ``lines``."""
        ...


def _stamp(ts: float) -> str:
    return time.strftime("%Y-%m-%d %H:%M", time.gmtime(ts))


def render_messages(messages: Sequence[Message], history: Sequence[Message] = ()) -> list[str]:
    """One line per message; a tool result becomes the question it answered and its time.

    Args:
        messages: the messages to render (a batch).
        history: earlier messages, searched for the user question before a batch's first tool result.

    Example:
        >>> m = [Message(role="user", content="Where is ORD-1?", timestamp=0),
        ...      Message(role="tool", content='{"status": "lost"}', category="tool_result", tool_name="track", timestamp=60)]
        >>> render_messages(m)[1]
        '[1970-01-01 00:01] tool track was consulted to answer: "Where is ORD-1?" (output not summarised)'
    """
    last_question = next((m.content for m in reversed(history) if m.role == "user"), "")
    lines = []
    for m in messages:
        if m.role == "tool" or m.category == "tool_result":
            question = last_question[:_QUESTION_CHARS] or "(no user question before it)"
            lines.append(f'[{_stamp(m.timestamp)}] tool {m.tool_name or "call"} was consulted to answer: '
                         f'"{question}" (output not summarised)')
            continue
        if m.role == "user":
            last_question = m.content
        tag = f"{m.category}, pinned" if m.retention >= 3 else m.category
        lines.append(f"[{_stamp(m.timestamp)}] {m.role} ({tag}): {m.content}")
    return lines


def summary_candidates(
    session: Session, messages: Sequence[Message], config: ContextConfig, now: float, *, force: bool = False,
) -> list[Message]:
    """Messages the next refresh should fold in, or [] when no refresh is due.

    Args:
        session: the session (its summary state says what is covered and when it was refreshed).
        messages: all messages of the session, in seq order.
        config: trigger, cooldown and recent-window settings.
        now: current time, epoch seconds.
        force: ignore trigger and cooldown (still keeps the recent window out).
    """
    uncovered = [m for m in messages if m.seq > session.summary.until_seq]
    keep = config.summary_keep_recent
    candidates = uncovered[: len(uncovered) - keep] if keep else uncovered
    if not candidates or force:
        return candidates
    if sum(m.tokens for m in candidates) < config.summary_trigger_tokens:
        return []
    if session.summary.updated_at > 0:
        # NOTE: the candidates are exactly the messages that arrived since the last refresh
        # (minus the recent window), so their count is the message-count side of the cooldown.
        cooled = (now - session.summary.updated_at >= config.summary_cooldown_s
                  or len(candidates) >= config.summary_cooldown_messages)
        if not cooled:
            return []
    return candidates


def plan_batches(messages: Sequence[Message], config: ContextConfig) -> list[list[Message]]:
    """Split ``messages`` into consecutive batches whose prompt fits ``summary_batch_tokens``.

    Budget of one batch's lines = batch_tokens - summary_max_tokens (the previous summary is in
    the prompt) - prompt overhead; a message is counted as its tokens + a line overhead. A message
    larger than that on its own is a batch by itself (:class:`LLMSummariser` truncates it).
    """
    room = max(64, config.summary_batch_tokens - config.summary_max_tokens - _PROMPT_OVERHEAD)
    batches: list[list[Message]] = []
    current: list[Message] = []
    used = 0
    for m in messages:
        cost = m.tokens + _LINE_OVERHEAD
        if current and used + cost > room:
            batches.append(current)
            current, used = [], 0
        current.append(m)
        used += cost
    if current:
        batches.append(current)
    return batches


def drop_repeated_lines(text: str) -> str:
    """``text`` without lines that repeat an earlier non-empty line (compared case- and
    whitespace-insensitively, bullets and bold marks ignored).

    NOTE: measured with the 1.5B summariser on a 60-turn conversation: greedy decoding looped
    over the same four bullets five times, a third of the summary's tokens; the repeats carry
    nothing and every later refresh would feed them back in.
    """
    seen: set[str] = set()
    out: list[str] = []
    for line in text.splitlines():
        key = " ".join(line.replace("*", "").strip(" -\t").lower().split())
        if key and key in seen:
            continue
        if key:
            seen.add(key)
        out.append(line)
    return "\n".join(out)


class LLMSummariser:
    """Summarises with a chat model, off the request path.

    Args:
        engine: the summariser model.
        temperature: sampling temperature (0 = most faithful copy of names and numbers).
        max_line_chars: longest single rendered line sent (a pasted log is cut, not the batch).
    """

    def __init__(self, engine: LLMEngine, temperature: float = 0.0, max_line_chars: int = 6000) -> None:
        self._engine = engine
        self._temperature = temperature
        self._max_line_chars = max_line_chars
        self.name = engine.model_name

    async def summarise(self, previous: str, lines: Sequence[str], max_tokens: int) -> str:
        """Ask the model for the updated summary."""
        # NOTE: ~0.75 words per token in English prose; the word cap keeps the answer inside
        # max_tokens so it is not cut mid-bullet.
        words = max(20, int(max_tokens * 0.6))
        body = "\n".join(line[: self._max_line_chars] for line in lines)
        system = SUMMARY_PROMPT.format(words=words)
        # NOTE: the language of what was said, not of the rendering's "[time] user (fact):" prefixes.
        if language_of([previous, *(line.split("): ", 1)[-1] for line in lines)]) == "zh":
            system += SUMMARY_PROMPT_ZH
        messages = [
            ChatMessage(role="system", content=system),
            ChatMessage(
                role="user",
                content=f"Previous summary:\n{previous or '(none yet)'}\n\nNew messages:\n{body}\n\n"
                "Write the updated summary.",
            ),
        ]
        params = GenerationParams(max_tokens=max_tokens, temperature=self._temperature)
        result = await self._engine.chat(messages, params)
        return drop_repeated_lines(result.text.strip())


class ExtractiveSummariser:
    """No-model summary: constraint and fact lines verbatim, tool uses as question + time.

    Greetings, chit-chat and assistant prose are dropped, and so are pinned (retention-3)
    lines: every mode keeps those verbatim already, so the summary's room goes to the rest. When the result exceeds
    ``max_tokens`` the oldest tool-use lines go first, then the oldest other lines.

    Args:
        counter: token counter for the length cap.
    """

    name = "extractive"

    def __init__(self, counter: TokenCounter | None = None) -> None:
        self._counter = counter or TiktokenCounter()

    async def summarise(self, previous: str, lines: Sequence[str], max_tokens: int) -> str:
        """Previous bullets plus the batch's constraint/fact/tool lines, capped to ``max_tokens``."""
        kept = [line for line in previous.splitlines() if line.strip()]
        for line in lines:
            if "was consulted to answer:" in line or "(constraint):" in line or "(fact):" in line:
                # NOTE: "(constraint, pinned):" lines do not match: pinned messages are never dropped.
                kept.append(f"- {line}")
        sizes = [await self._counter.count(line) + 1 for line in kept]
        total = sum(sizes)
        order = [i for i, line in enumerate(kept) if "was consulted to answer" in line]
        order += [i for i, line in enumerate(kept) if "was consulted to answer" not in line]
        dropped: set[int] = set()
        for i in order:
            if total <= max_tokens:
                break
            dropped.add(i)
            total -= sizes[i]
        return "\n".join(line for i, line in enumerate(kept) if i not in dropped)
