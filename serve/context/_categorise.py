"""Categorise messages: rules first, an optional router-model classifier for what rules cannot tell.

Categories and the retention they imply (003's levels, see :func:`default_retention`):

* ``constraint`` (2; 3 from a system message): the user binds future answers: "never", "must", "always", "don't",
  "only", budgets ("under $300", "budget of"), deadlines ("by Friday", "no later than").
* ``fact`` (1): verifiable specifics: order/ticket ids, amounts, dates, phone-like numbers,
  names with titles, "my name is", "I live in".
* ``tool_result`` (1): any ``tool`` role message.
* ``greeting`` (0): short pleasantries with nothing else in them.
* ``chat`` (1): the rest.

Each rule has a Chinese form beside the English one (the design sources' language, issue 39):
constraints 必须 / 务必 / 一定要 / 只能 / 禁止 / 请勿 / 不要 / 千万别 / 不得 / 最多 / 不超过 / 预算, and
deadlines (下周三之前, 5月10日前, 月底前); facts 我叫 / 我的地址 / 客户编号 / 订单号 / 我付了; greetings
你好 / 谢谢 / 好的; a question ends with "？" as well as "?". See docs/languages.md.

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
# NOTE: no \b in Chinese (no spaces between words): each alternative is a whole word or phrase.
# "别" alone is left out ("特别", "区别", "别人"); its imperative forms are listed instead.
_ZH_WEEKDAY = r"(?:周|星期|礼拜)[一二三四五六日天]"
_CONSTRAINT_ZH_RE = re.compile(
    r"必须|务必|一定要|只能|只用|只接受|禁止|请勿|切勿|不要|不许|不准|不得|千万别|别再|别给|别在|别打|别发|别用|"
    r"绝对不|永远不|从不|总是|始终|每次都|最多|至多|至少|不超过|不能超过|不高于|不低于|预算|截止|最晚|最迟|"
    r"过敏|拒绝|不希望|不想让|不愿意|"
    rf"(?:(?:下|上|这|本)?(?:个)?{_ZH_WEEKDAY}|\d{{1,2}}月\d{{1,2}}[日号]|\d{{1,2}}[日号]|月底|月初|年底|明天|后天|"
    r"今天|今晚|本周|下周|下个月|月中)(?:之前|以前|前)"
)
_FACT_ZH_RE = re.compile(
    r"我叫|我的名字|我姓|我住在|我住|我的地址|收货地址|送货地址|我家地址|我的电话|手机号|联系电话|我的邮箱|邮箱是|"
    r"我的订单|订单号|我买了|我购买了|我下单|我付了|我支付了|付款|扣了|扣款|被扣|客户编号|会员号|账号|工单号|"
    r"我(?:们)?(?:公司|老板|经理|太太|先生|丈夫|妻子|儿子|女儿)(?:是|叫)"
)
_GREETING_ZH_RE = re.compile(
    r"^\W*(?:你好|您好|hello|嗨|早上好|上午好|下午好|晚上好|早安|晚安|谢谢(?:你|您)?(?:了|啦)?|多谢|感谢|好的|好|嗯+|"
    r"行|可以|收到|明白了?|知道了|了解|没问题|再见|拜拜|辛苦了?)(?:[，,\s]*(?:谢谢|再见|拜拜|了|啦|呀|哈))*[\W\s~～]*$",
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
            >>> RuleCategoriser().categorise("user", "所有报价必须用人民币。")
            'constraint'
        """
        if role == "tool":
            return "tool_result"
        text = content.strip()
        if len(text) <= _GREETING_MAX_CHARS and (_GREETING_RE.match(text) or _GREETING_ZH_RE.match(text)):
            return "greeting"
        if text.endswith(("?", "？")):
            # NOTE: a question asks, it does not set a rule ("Do you always ship on Sundays?");
            # one that carries specifics still records them.
            return "fact" if _entities(text, has_entities) else "chat"
        if role in ("user", "system") and (_CONSTRAINT_RE.search(text) or _CONSTRAINT_ZH_RE.search(text)):
            return "constraint"
        if _FACT_RE.search(text) or _FACT_ZH_RE.search(text) or _entities(text, has_entities):
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
