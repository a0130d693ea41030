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
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field

from kernels import StrictModel
from memory_shards.retrieval._text import analyse

__all__ = ["WriteFilterConfig", "worth_storing", "DECISION_OUTCOME", "ANSWER_OUTCOME"]

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
