"""What a chat exchange leaves in memory: facts, decisions and outcomes, not greetings or questions.

The chat write-back (``chat.write_back``) passes every finished exchange through
:func:`worth_storing` (config ``chat.write_filter``). Rules, in order, per sentence of the user's
message (sentences split after ``. ! ?`` and newlines)::

    small talk   every word is a greeting, thanks, acknowledgement or filler   -> drop
    question     ends with "?" or starts with a question word / "can you"...   -> drop
    informative  otherwise, with >= min_content_words content words            -> keep

where content words are the lexical index's terms (``analyse``: stop words out, stems). The
exchange is stored when the user said at least one informative sentence, or when either side
states a decision or an outcome (a user sentence with one of ``DECISION_OUTCOME``'s words:
"decided", "booked", "prefer", "fixed"...; an answer sentence with a past-tense action of
``ANSWER_OUTCOME``: "booked", "cancelled", "refunded", "escalated"...). The stored text keeps the informative and
decision/outcome sentences of the user and the whole answer (its context); a restated question
and a greeting never reach the store.

``mode: all`` stores every exchange (the behaviour before the filter).

The stored exchange is built here only (:func:`exchange_write`, and :func:`with_speaker` for the
agent's own exchange write), with ``metadata.speaker`` = who said it, so that retrieval's named-speaker
lists (``memory.retrieval.name_boost``: a question naming "Melanie" ranks Melanie's memories among
themselves) reach chat memories too::

    speaker = name of the question's user message          (OpenAI ``messages[].name``)
            | name of the latest earlier user message that has one (the same author, known from the request)
            | "user"                                       (the role, when no message names its author)

PII masking (``recallserve.serve.pii.apply_pii`` under the write-back policy) applies to the name as to the text:
a name field holding an e-mail or a phone number is stored masked.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from typing import Literal, Protocol

from pydantic import Field

from recallserve.kernels import StrictModel
from recallserve.memory_shards.retrieval._text import analyse
from recallserve.serve.memory import MemoryWrite, derived_metadata
from recallserve.serve.pii import PiiMode, apply_pii

__all__ = ["WriteFilterConfig", "worth_storing", "speaker_name", "exchange_write", "with_speaker",
           "DECISION_OUTCOME", "ANSWER_OUTCOME"]

_SENTENCE = re.compile(r"(?<=[.!?])\s+|\n+")
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)?", re.UNICODE)

# NOTE: words of greetings, thanks, acknowledgements and fillers; a sentence made only of these
# (and stop words) is small talk.
_SMALL_TALK = frozenset(
    """hi hello hey hiya morning afternoon evening good night bye goodbye cheers thanks thank thx ty you
    please ok okay k sure great cool nice awesome perfect fine got it yes yeah yep no nope alright
    right sounds lol haha wow welcome appreciate appreciated much lot so very again all the a for that
    is it's its this that's and well oh ah hmm understood noted will do see later""".split()
)
_QUESTION_START = re.compile(
    r"^\s*(what|when|where|which|who|whom|whose|why|how|is|are|am|was|were|do|does|did|can|could|would|"
    r"will|should|shall|may|might|have|has|had)\b",
    re.IGNORECASE,
)
DECISION_OUTCOME = frozenset(
    """decide decided decision chose chosen choose pick picked going plan planned planning booked book
    schedule scheduled ordered order bought purchased signed agreed agree confirm confirmed approve
    approved cancel cancelled canceled refund refunded fixed fix resolved resolve solved worked works
    failed fails broke broken succeeded completed finished shipped delivered moved switched started
    stopped prefer preferred allergic remember""".split()
)
# NOTE: the answer counts only with past-tense actions done in the turn: a customer-service
# answer says "refund" or "order" in every policy explanation, which is no outcome.
ANSWER_OUTCOME = frozenset(
    """decided booked scheduled ordered cancelled canceled confirmed approved refunded resolved fixed
    shipped created updated escalated""".split()
)


class WriteFilterConfig(StrictModel):
    """Which chat exchanges the write-back stores (``chat.write_filter``)."""

    mode: Literal["facts", "all"] = Field(
        default="facts",
        description="'facts': store exchanges where the user states something or a decision/outcome is said; "
                    "'all': store every exchange.",
    )
    min_content_words: int = Field(
        default=3, ge=1, le=50,
        description="Content words (stop words out) a user sentence needs to count as a statement worth storing.",
    )


def _sentences(text: str) -> list[str]:
    return [s.strip() for s in _SENTENCE.split(text) if s and s.strip()]


def _small_talk(sentence: str) -> bool:
    words = [w.lower() for w in _WORD.findall(sentence)]
    return all(w in _SMALL_TALK for w in words)


def _question(sentence: str) -> bool:
    return sentence.rstrip().endswith("?") or bool(_QUESTION_START.match(sentence))


def _has_word(sentence: str, words: frozenset[str]) -> bool:
    return any(w.lower() in words for w in _WORD.findall(sentence))


def worth_storing(question: str, answer: str, config: WriteFilterConfig | None = None) -> str | None:
    """The memory text of one exchange, or None when it holds nothing worth storing.

    Args:
        question: the user's message of the turn.
        answer: the assistant's answer.
        config: filter settings (default: ``facts``, 3 content words).

    Example:
        >>> worth_storing("Hi! What is the refund policy?", "Refunds take 5 days.") is None
        True
        >>> worth_storing("I moved to Lisbon last spring.", "Noted!")
        'user: I moved to Lisbon last spring.\\nassistant: Noted!'
    """
    cfg = config or WriteFilterConfig()
    if cfg.mode == "all":
        return f"user: {question}\nassistant: {answer}"
    kept = []
    for sentence in _sentences(question):
        if _small_talk(sentence):
            continue
        if _has_word(sentence, DECISION_OUTCOME) and not _question(sentence):
            kept.append(sentence)
        elif not _question(sentence) and len(analyse(sentence)) >= cfg.min_content_words:
            kept.append(sentence)
    answer_decides = any(_has_word(s, ANSWER_OUTCOME) and not _question(s) for s in _sentences(answer))
    if not kept and not answer_decides:
        return None
    user = " ".join(kept) if kept else question.strip()
    return f"user: {user}\nassistant: {answer}"


class _Authored(Protocol):
    """A chat message as far as authorship goes (``ChatCompletionMessage``: role and OpenAI's ``name``)."""

    role: str
    name: str | None


def speaker_name(messages: Sequence[_Authored], pii: PiiMode) -> str:
    """Who said the exchange's user message: its ``name``, else the latest earlier user ``name``, else ``"user"``.

    Args:
        messages: the request's messages, in order (the question is the last user message).
        pii: the write-back's PII policy (``recallserve.serve.pii.for_write_back`` of the tenant's): the name is stored
            masked like the text.

    Example:
        >>> from types import SimpleNamespace as M
        >>> speaker_name([M(role="user", name="Melanie"), M(role="assistant", name=None),
        ...               M(role="user", name=None)], "mask")
        'Melanie'
        >>> speaker_name([M(role="user", name=None)], "mask")
        'user'
    """
    # NOTE: an earlier user message's name counts: a client that names the author once (the first
    # message of a conversation) still means the same person in later turns of the same request.
    named = [m.name.strip() for m in messages if m.role == "user" and m.name and m.name.strip()]
    return apply_pii(named[-1], pii) if named else "user"


def exchange_write(kept: str, *, speaker: str, user: str, request_id: str, session: str,
                   pii: PiiMode, cites: Sequence[str] = ()) -> MemoryWrite:
    """The chat write-back's memory of one exchange (``kept``: :func:`worth_storing`'s text), PII-masked.

    ``source_id`` is ``chat:<user>:<request id>`` (a retried request overwrites its own memory);
    metadata holds the end user's id, the speaker's name (:func:`speaker_name`) and the session, and
    marks the exchange as derived (it holds the assistant's answer) with the source ids the answer
    cited (``cites``; :func:`recallserve.serve.memory.cited_sources`).
    """
    return MemoryWrite(text=apply_pii(kept, pii), kind="message", source_id=f"chat:{user}:{request_id}",
                       metadata={"user": user, "speaker": speaker, "session_id": session, **derived_metadata(cites)},
                       user=user)


def with_speaker(writes: Sequence[MemoryWrite], speaker: str) -> list[MemoryWrite]:
    """``writes`` with ``metadata.speaker`` set on the exchange ones (kind ``message``; image units keep theirs)."""
    return [w.model_copy(update={"metadata": {**w.metadata, "speaker": speaker}}) if w.kind == "message" else w
            for w in writes]
