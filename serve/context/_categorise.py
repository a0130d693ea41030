"""Categorise messages: rules first, an optional router-model classifier for what rules cannot tell.

Categories and the retention they imply (003's levels, see :func:`default_retention`):

* ``constraint`` (2; 3 from a system message): the user binds future answers: "never", "must", "always", "don't",
  "only", budgets ("under $300", "budget of"), deadlines ("by Friday", "no later than").
* ``fact`` (1): verifiable specifics: order/ticket ids, amounts, dates, phone-like numbers,
  names with titles, "my name is", "I live in".
* ``tool_result`` (1): any ``tool`` role message.
* ``greeting`` (0): short pleasantries with nothing else in them.
* ``chat`` (1): the rest.

Only user (and system) messages can be constraints: an assistant saying "you must restart the
router" is advice, not a rule the user set. Assistant messages with specifics count as facts.
"""

from __future__ import annotations

import json
import re
from typing import Protocol, runtime_checkable

from recallserve.serve.context._entities import has_entity
from recallserve.serve.context._types import Category, MessageIn, default_retention
from recallserve.serve.engine import ChatMessage, GenerationParams, LLMEngine

__all__ = ["Classifier", "RuleCategoriser", "LLMClassifier", "Categoriser"]

_CONSTRAINT_RE = re.compile(
    r"\b(never|always|must(?:n't| not)?|do not|don't|dont|only (?:use|ship|send|contact|call|email|"
    r"deliver|pay|book|want)|under no circumstances|at most|at least|no more than|no later than|"
    r"not (?:exceed|above|over|more than)|budget|deadline|by (?:monday|tuesday|wednesday|thursday|friday|"
    r"saturday|sunday|tomorrow|tonight|the end of)|before (?:\d|monday|tuesday|wednesday|thursday|friday|"
    r"saturday|sunday)|avoid|allergic|refuse|prefer not|please stop)\b",
    re.IGNORECASE,
)
_FACT_RE = re.compile(
    r"\b(my name is|i live (?:at|in)|my (?:delivery |home |billing |shipping |postal )?address|my account|"
    r"my email|my phone|my (?:mobile |phone )?number|my order|i ordered|i paid|i was charged|"
    r"my (?:wife|husband|son|daughter|manager|company) is)\b",
    re.IGNORECASE,
)
_GREETING_RE = re.compile(
    r"^\W*(hi|hello|hey|good (?:morning|afternoon|evening)|thanks?(?: you)?(?: so much| a lot)?|thank you|"
    r"ok(?:ay)?|great|cheers|bye|goodbye|have a (?:nice|good|great) day|you're welcome|no problem|"
    r"sounds good|perfect|cool|got it)[\s\W]*(there|again|a lot|so much|!|\.)*\W*$",
    re.IGNORECASE,
)
# NOTE: only messages this short can be pure pleasantries; longer ones carry content.
_GREETING_MAX_CHARS = 60


@runtime_checkable
class Classifier(Protocol):
    """An optional model-based classifier (e.g. the router model) for messages rules call ``chat``."""

    async def classify(self, role: str, content: str) -> Category | None:
        """Return a category, or None when unsure (the rule result stands)."""
        ...


class RuleCategoriser:
    """Deterministic regex rules; cheap enough to run on every message on the request path."""

    def categorise(self, role: str, content: str, has_entities: bool | None = None) -> Category:
        """Category of one message by rules alone.

        Args:
            has_entities: whether ``content`` holds an entity, when the caller has already extracted
                them (one scan of the text instead of two); None = scanned here.

        Example:
            >>> RuleCategoriser().categorise("user", "Never call me before 9am.")
            'constraint'
        """
        if role == "tool":
            return "tool_result"
        text = content.strip()
        if len(text) <= _GREETING_MAX_CHARS and _GREETING_RE.match(text):
            return "greeting"
        if text.endswith("?"):
            # NOTE: a question asks, it does not set a rule ("Do you always ship on Sundays?");
            # one that carries specifics still records them.
            return "fact" if _entities(text, has_entities) else "chat"
        if role in ("user", "system") and _CONSTRAINT_RE.search(text):
            return "constraint"
        if _FACT_RE.search(text) or _entities(text, has_entities):
            return "fact"
        return "chat"


def _entities(text: str, known: bool | None) -> bool:
    return has_entity(text) if known is None else known


_CLASSIFY_SCHEMA = {
    "type": "object",
    "properties": {"category": {"type": "string", "enum": ["chat", "constraint", "fact", "greeting"]}},
    "required": ["category"],
}
_CLASSIFY_PROMPT = (
    "Classify one chat message from a customer-service conversation. Answer JSON "
    '{"category": ...} with one of: "constraint" (the user sets a rule, preference, budget or '
    'deadline that later answers must respect), "fact" (a verifiable specific: id, amount, date, '
    'name, address), "greeting" (only a pleasantry), "chat" (anything else).'
)


class LLMClassifier:
    """A :class:`Classifier` backed by a chat model (the router), constrained to a JSON schema.

    Args:
        engine: the model; any :class:`~recallserve.serve.engine.LLMEngine`.
        max_chars: longest message prefix sent (classification needs the gist, not all of it).
    """

    def __init__(self, engine: LLMEngine, max_chars: int = 1500) -> None:
        self._engine = engine
        self._max_chars = max_chars

    async def classify(self, role: str, content: str) -> Category | None:
        """Ask the model; None on an unparsable or unexpected answer."""
        messages = [
            ChatMessage(role="system", content=_CLASSIFY_PROMPT),
            ChatMessage(role="user", content=f"{role}: {content[: self._max_chars]}"),
        ]
        params = GenerationParams(max_tokens=16, temperature=0.0, json_schema=_CLASSIFY_SCHEMA)
        result = await self._engine.chat(messages, params)
        try:
            category = json.loads(result.text).get("category")
        except (ValueError, AttributeError):
            return None
        return category if category in ("chat", "constraint", "fact", "greeting") else None


class Categoriser:
    """Rules, then (when configured) the classifier for messages the rules call ``chat``.

    Args:
        classifier: optional model-based classifier.
    """

    def __init__(self, classifier: Classifier | None = None) -> None:
        self._rules = RuleCategoriser()
        self._classifier = classifier

    async def categorise(self, message: MessageIn, rule: Category | None = None) -> tuple[Category, int]:
        """(category, retention) of ``message``; caller-forced values win.

        Retention comes from the category and role (:func:`default_retention`) unless forced. ``rule``: the
        rules' category when the caller already has it (None = computed here).
        """
        category = message.category or rule or self._rules.categorise(message.role, message.content)
        if message.category is None and category == "chat" and self._classifier is not None:
            # NOTE: only ambiguous messages pay for a model call; rule hits are trusted.
            guess = await self._classifier.classify(message.role, message.content)
            if guess == "constraint" and message.role not in ("user", "system"):
                guess = "fact"
            category = guess or category
        retention = message.retention if message.retention is not None else default_retention(category, message.role)
        return category, retention
