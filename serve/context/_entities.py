"""The entity table: order ids, amounts, dates, times, phone-like and id-like numbers, titled names.

Entities are pulled out of every non-tool message by regular expressions when the message is
stored (cheap, deterministic, no model), and kept *verbatim* beside the rolling summary: a
summariser may paraphrase "ORD-48213" into "the order", the table never does.

Personal values are masked before they are stored anywhere in the table:

* phone, card, IBAN and account numbers -> ``****0199`` (the last 4 digits),
* emails -> ``m***@example.com`` (first character and the domain).

Chinese forms sit beside the English ones (issue 39, docs/languages.md): amounts 5万元 / 110万 /
¥249 / 人民币3000元 / 五万元, dates 2026年3月5日 / 3月5日 / 下周三 / 15号, times 上午十点 / 下午3点半, ids
named by 订单号 / 工单号 / 运单号, mainland mobile numbers (masked as phones), and names with a title
after a surname: 张总, 李经理, 王小明先生.

Each entity keeps a short snippet of the sentence it came from (masked too, then passed through
:func:`recallserve.serve.pii.mask_pii` so ID-card numbers, SSNs and passwords never reach the table),
because an amount or a date without what it refers to is of little use to the model.
"""

from __future__ import annotations

import re
from bisect import bisect_right
from dataclasses import dataclass

from recallserve.serve.pii import mask_pii

__all__ = ["Entity", "extract_entities", "has_entity", "mask_personal", "format_entity"]

_MONTH = (
    r"(?:Jan(?:uary)?|Feb(?:ruary)?|Mar(?:ch)?|Apr(?:il)?|May|June?|July?|Aug(?:ust)?|"
    r"Sep(?:t(?:ember)?)?|Oct(?:ober)?|Nov(?:ember)?|Dec(?:ember)?)"
)
_TITLE = (
    r"(?:Mr|Mrs|Ms|Miss|Mx|Dr|Prof|Professor|Sir|Dame|Rev|Reverend|Capt|Captain|Judge|Lord|Lady|"
    r"Sgt|Sergeant|Col|Colonel|Gen|General|Fr|Father|Sister|Rabbi|Imam|Hon)"
)
_NAME_PART = r"[A-Z\u00c0-\u00dd][^\W\d_]*(?:['\u2019-][^\W\d_]+)*"
_NAME_TAIL = rf"(?:\s+(?:(?:Jr|Sr)\.|{_NAME_PART}|van|von|der|den|del|de|da|la|le|bin|al)){{0,4}}(?:,?\s+(?:Jr|Sr|II|III|IV|PhD|MD|Esq)\.?)?"

# NOTE: Chinese: common surnames (the ~100 most frequent single-character ones) followed by a title;
# "总" only when no word continues it (总是 / 总共 / 总结 are not titles), and no surname right after
# 下/上/这/本/每 (下周总是 is not 周总).
_ZH_SURNAME = (
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘于蒋蔡余杜叶程苏魏吕丁任沈姚卢"
    "姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾毛郝龚邵万钱严覃武戴莫孔向汤欧"
)
_ZH_TITLE = r"(?:总经理|总监|总裁|董事长|经理|先生|女士|小姐|老师|医生|主任|律师|工程师|师傅|教授|博士|部长|处长|科长|主管|专员)"
_ZH_NUM = "零〇一二两三四五六七八九十百千万亿"
_ZH_WEEKDAY = r"(?:周|星期|礼拜)[一二三四五六日天]"

# NOTE: Han characters are word characters to ``re``, so "型号KF-2208X" has no ``\b`` before "K" and
# "电话021-..." fails a ``(?<![\w-])``. The English patterns are compiled with :func:`_han_aware`, in
# which a change between a Han and a non-Han character also counts as a word boundary; English text
# (no Han) matches exactly as before.
_HAN_CLASS = r"\u3400-\u4dbf\u4e00-\u9fff"
_BOUNDARY = rf"(?:\b|(?<=[{_HAN_CLASS}])(?![{_HAN_CLASS}])|(?<![{_HAN_CLASS}])(?=[{_HAN_CLASS}]))"


def _han_aware(pattern: str) -> re.Pattern[str]:
    r"""``pattern`` compiled with each ``\b`` read as :data:`_BOUNDARY` and ``(?<![\w-])`` not counting Han."""
    pattern = pattern.replace(r"(?<![\w-])", rf"(?<![^\W{_HAN_CLASS}]|-)").replace(r"\b", _BOUNDARY)
    return re.compile(pattern)


# NOTE: order matters: personal numbers (cards, IBANs, phones) are matched before generic ids
# and amounts, and a span matched once is not matched again by a later pattern.
_PATTERNS: list[tuple[str, re.Pattern[str]]] = [
    # NOTE: bounded quantifiers (as serve.pii's e-mail): with "+", a run such as "a.a.a..." (a word
    # boundary at every letter) or "1,1,1,..." (the amount below) was scanned from each start to its
    # end and back, O(n^2): 40,000 characters took 7 s (e-mail) and 45 s (amount) of one core.
    ("email", _han_aware(rf"\b(?:[^\W{_HAN_CLASS}]|[.+-]){{1,64}}@[\w-]{{1,63}}(?:\.[\w-]{{1,63}})+\b")),
    ("iban", _han_aware(r"\b[A-Z]{2}\d{2}(?: ?[A-Z0-9]{4}){3,7}(?: ?[A-Z0-9]{1,4})?\b")),
    ("card", _han_aware(r"\b(?:\d{4}[ -]){3}\d{4}\b|\b\d{15,16}\b")),
    ("account", _han_aware(r"(?i:\b(?:account|acct|membership|customer)\s*(?:number|no\.?|#|id)?\s*(?::|is|was)?\s*)(\d{6,14})\b")),
    # A bare number named by its noun ("order 104208", "invoice no. 5531"): an id, not a phone.
    ("id", _han_aware(r"(?i:\b(?:order|ticket|invoice|ref(?:erence)?|case|tracking|booking|reservation|parcel|"
                      r"shipment|return|rma)\s*(?:number|no\.?|id)?\s*(?::|is|was)?\s*)(#?\d{4,14})\b")),
    # Mainland mobile numbers: 11 digits from 13x-19x, written without separators.
    ("phone", re.compile(r"(?<![\d-])(?:\+?86[\s-]?)?1[3-9]\d{9}(?!\d)")),
    ("account", re.compile(r"(?:账号|账户|卡号|银行卡号)(?:是|为|：|:)?\s*(\d{6,19})(?!\d)")),
    ("id", re.compile(r"(?:订单|工单|运单|快递单|发票|单|编|会员|票|合同|案件)(?:号|号码|编号)(?:是|为|：|:)?\s*(#?\d{4,14})(?!\d)")),
    ("phone", _han_aware(r"(?<![\w-])(?:\+\d{1,3}[\s.-]?)?(?:\(\d{2,4}\)[\s.-]?)?\d{2,4}[\s.-]\d{3,4}[\s.-]?\d{2,4}\b")),
    ("id", _han_aware(r"\b(?:[A-Z]{2,6}-?\d{3,}[A-Z0-9]*(?:-[A-Z0-9]+)*|1Z[A-Z0-9]{14,16}|[A-Z]{1,4}\d{2,}[A-Z]\d{2,}[A-Z0-9]*)\b|#\d{4,}\b")),
    ("amount", _han_aware(
        r"(?:[$\u20ac\u00a3]\s?\d[\d,]*(?:\.\d{1,2})?(?:\s?(?:k|million|bn)\b)?"
        r"|\b\d[\d,]{0,31}(?:\.\d{1,2})?\s?(?:USD|EUR|GBP|dollars|euros|pounds)\b)"
    )),
    ("amount", re.compile(
        r"(?:[¥￥]|人民币|RMB\s?)\s?\d[\d,]{0,31}(?:\.\d{1,2})?(?:[万亿]元?|元)?"
        r"|\d[\d,]{0,31}(?:\.\d{1,2})?\s?(?:[万千百亿]?(?:元|块钱|块|美元|欧元|英镑)|[万亿](?:元|人民币)?(?![个次件台条人]))"
    )),
    ("date", re.compile(
        r"(?<!\d)(?:\d{4}年\d{1,2}月(?:\d{1,2}[日号])?|\d{1,2}月\d{1,2}[日号]"
        # NOTE: a bare day ("15号") only before 前 / 之前 / a part of the day: "科技园路35号" is an address.
        r"|(?<![路街道巷弄楼室栋区层])\d{1,2}[日号](?=之?前|以前|上午|下午|晚上))"
    )),
    ("date", _han_aware(
        rf"\b\d{{4}}-\d{{2}}-\d{{2}}\b|\b\d{{1,2}}/\d{{1,2}}/\d{{2,4}}\b"
        rf"|\b{_MONTH}\.?\s+\d{{1,2}}(?:st|nd|rd|th)?(?:,?\s+\d{{4}})?\b"
        rf"|\b\d{{1,2}}(?:st|nd|rd|th)?\s+(?:of\s+)?{_MONTH}(?:,?\s+\d{{4}})?\b"
    )),
    ("time", _han_aware(r"(?i:\b\d{1,2}(?::[0-5]\d)?\s?[ap]\.?m\.?(?![a-z])|\b(?:[01]?\d|2[0-3]):[0-5]\d\b)")),
    ("time", re.compile(r"(?<!\d)(?:上午|下午|晚上|早上|中午|凌晨|傍晚)?\d{1,2}(?:[:：][0-5]\d|[点时](?:\d{1,2}分|半|一刻)?)")),
    ("name", _han_aware(rf"\b{_TITLE}\.?\s+{_NAME_PART}{_NAME_TAIL}")),
    ("name", _han_aware(rf"(?i:\bmy name is\s+|\bthis is\s+|\bi am\s+|\bi'm\s+)({_NAME_PART}(?:\s+{_NAME_PART}){{1,3}})")),
    # Digit-free Chinese forms (scanned only when the text holds a Han character: _HAN_PATTERNS).
    ("amount", re.compile(rf"[{_ZH_NUM}]{{1,16}}(?:元|块钱|万元|块)")),
    ("date", re.compile(rf"(?:(?:下|上|这|本)个?)?{_ZH_WEEKDAY}|[{_ZH_NUM}]{{1,3}}月[{_ZH_NUM}]{{1,3}}[日号]")),
    ("time", re.compile(rf"(?:上午|下午|晚上|早上|中午|凌晨|傍晚)[{_ZH_NUM}]{{1,3}}[点时](?:半|一刻|[{_ZH_NUM}]{{1,3}}分)?")),
    ("name", re.compile(rf"(?<![下上这本每])[{_ZH_SURNAME}](?:总(?![是共结计额体之的部公裁监经])|[\u4e00-\u9fff]{{0,2}}?{_ZH_TITLE})")),
]
#: The patterns above that need a Han character, not a digit, to match.
_HAN_PATTERNS = frozenset(range(len(_PATTERNS) - 4, len(_PATTERNS)))
_PERSONAL = {"email", "iban", "card", "account", "phone"}
_DIGITS = re.compile(r"\d")
# NOTE: what every match of a kind's patterns contains: a digit (``\d``, the class the patterns use) unless
# listed here. A text without it skips those patterns for the cost of one search: digit-free prose is
# scanned ~4x faster (2 patterns instead of 12). A new kind whose matches need no digit belongs here.
_NEEDS = {"email": "@", "name": ""}
_ANY_DIGIT = re.compile(r"\d")
_HAN = re.compile(r"[\u3400-\u4dbf\u4e00-\u9fff]")
# NOTE: a sentence ends at . ! ? followed by a space or the end, unless the dot closes a title
# abbreviation ("Dr. Maria") or sits inside a number or an address ("$249.99", "a.b@c.com").
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|(?<=[。！？；])|\n+")
_ABBREV_END = re.compile(rf"\b{_TITLE}\.$|\b(?:e\.g|i\.e|etc|vs|No|St)\.$")
# NOTE: snippets longer than this cost entity budget without helping recall.
_SNIPPET_CHARS = 90
# NOTE: a "sentence" longer than this (no sentence end in 2,000 characters) is a dump, not prose: its
# entities keep their values but get no snippet, so it is not masked whole for 90 characters of
# context (a 200k-character run of e-mail-like tokens took ~0.5 s of masking per message).
_MAX_SENTENCE_CHARS = 2000
# NOTE: entity spans read from one text: a message with more is a data dump (the table's budget keeps
# a few dozen anyway), and each span costs Python work, so the scan stops there. Masking
# (mask_personal) is never capped: every personal value of a text is masked.
MAX_ENTITY_SPANS = 256
# NOTE: and at most this many pattern matches per span of the cap are examined (accepted or not).
_EXAMINED_PER_SPAN = 4
# NOTE: the abbreviation check reads only this many characters before a sentence end: the longest
# abbreviation ("Professor.") and the character before it (for its word boundary) fit well inside.
_ABBREV_WINDOW = 32


@dataclass(frozen=True)
class Entity:
    """One entity occurrence (value already masked when personal).

    Attributes:
        kind: email | iban | card | account | phone | id | amount | date | time | name.
        value: verbatim (or masked) value.
        snippet: the sentence around it, masked, at most ~90 characters.
        first_seq: seq of the message it was first seen in (-1 = not stored yet).
        last_seq: seq of the message it was last seen in (-1 = not stored yet).
    """

    kind: str
    value: str
    snippet: str
    first_seq: int = -1
    last_seq: int = -1


def _mask(kind: str, raw: str) -> str:
    if kind == "email":
        local, _, domain = raw.partition("@")
        return f"{local[:1]}***@{domain}"
    # NOTE: the last 4 characters stay: enough for the user to recognise the number, too few to
    # reuse it.
    tail = raw.replace(" ", "")[-4:] if kind == "iban" else "".join(_DIGITS.findall(raw))[-4:]
    return f"****{tail}"


def _scan(text: str, limit: int | None = None, first: bool = False) -> list[tuple[int, int, str, str]]:
    """(start, end, kind, raw) spans, earlier patterns winning overlaps; at most ``limit`` (None: all),
    from at most ``4 x limit`` pattern matches; ``first``: stop at the first span taken.

    NOTE: the spans taken so far are kept sorted by start (they never overlap, so also by end) and
    a match is checked against its two neighbours only; a scan over every taken span made a
    message of 49,000 short e-mail-like tokens ("a@b.a@b. ...") cost minutes of the event loop.
    """
    starts: list[int] = []
    ends: list[int] = []
    spans: list[tuple[int, int, str, str]] = []
    # NOTE: matches the rules below reject (overlaps, phone-like runs of too many digits) count too, so
    # a text of thousands of such matches costs bounded Python work, not one step per match.
    examined = 0
    digit = _ANY_DIGIT.search(text) is not None
    han = _HAN.search(text) is not None
    for number, (kind, pattern) in enumerate(_PATTERNS):
        if number in _HAN_PATTERNS:
            if not han:
                continue
        elif (not digit if (needs := _NEEDS.get(kind)) is None else needs not in text):
            continue
        for m in pattern.finditer(text):
            examined += 1
            if limit is not None and examined > _EXAMINED_PER_SPAN * limit:
                spans.sort()
                return spans
            group = 1 if m.re.groups else 0
            start, end = m.span(group)
            raw = m.group(group).strip().rstrip(",")
            if not raw:
                continue
            at = bisect_right(starts, start)
            if (at > 0 and ends[at - 1] > start) or (at < len(starts) and starts[at] < end):
                continue
            if kind == "phone" and not 7 <= len(_DIGITS.findall(raw)) <= 15:
                continue
            starts.insert(at, start)
            ends.insert(at, end)
            spans.append((start, end, kind, raw))
            if first or (limit is not None and len(spans) >= limit):
                spans.sort()
                return spans
    spans.sort()
    return spans


def mask_personal(text: str) -> str:
    """``text`` with emails, phones, card/IBAN/account numbers replaced by their masked form.

    Example:
        >>> mask_personal("call +1 415 555 0199")
        'call ****0199'
    """
    out, last = [], 0
    for start, end, kind, raw in _scan(text):
        if kind in _PERSONAL:
            out.append(text[last:start])
            out.append(_mask(kind, raw))
            last = end
    out.append(text[last:])
    return "".join(out)


def _sentence_starts(text: str) -> list[int]:
    """Start offsets of the sentences of ``text`` (the first is 0), in order."""
    bounds = [0]
    for m in _SENTENCE_END.finditer(text):
        # NOTE: only the characters just before the end are read (_ABBREV_WINDOW): the whole
        # sentence so far made a run of "Dr. Dr. ..." (no end accepted) cost quadratic time.
        if not _ABBREV_END.search(text[max(bounds[-1], m.start() - _ABBREV_WINDOW) : m.start()]):
            bounds.append(m.end())
    return bounds


def _snippet(sentence: str) -> str:
    """``sentence`` masked and cut to :data:`_SNIPPET_CHARS`; "" for one over :data:`_MAX_SENTENCE_CHARS`."""
    sentence = sentence.strip()
    if len(sentence) > _MAX_SENTENCE_CHARS:
        return ""
    sentence = mask_pii(mask_personal(sentence))
    if len(sentence) > _SNIPPET_CHARS:
        sentence = sentence[: _SNIPPET_CHARS - 3].rstrip() + "..."
    return sentence


def has_entity(text: str) -> bool:
    """``bool(extract_entities(text))``, from a scan that stops at the first span taken.

    The rule categoriser asks only this, so its scan ends at the first pattern that takes a span
    (a 200,000-character text holding an amount: 0.42 -> 0.20 s); a text without entities costs the
    same full scan as :func:`extract_entities`.
    """
    return bool(_scan(text, MAX_ENTITY_SPANS, first=True))


def extract_entities(text: str) -> list[Entity]:
    """Entities of ``text`` in order of appearance, personal values masked, duplicates removed.

    At most :data:`MAX_ENTITY_SPANS` spans are read (a dump's first ones, by pattern order), and a
    sentence over :data:`_MAX_SENTENCE_CHARS` gives its entities no snippet: the cost is bounded per text.

    Example:
        >>> [(e.kind, e.value) for e in extract_entities("Refund $249.99 for ORD-48213 by March 3")]
        [('amount', '$249.99'), ('id', 'ORD-48213'), ('date', 'March 3')]
    """
    seen: set[tuple[str, str]] = set()
    out: list[Entity] = []
    starts = _sentence_starts(text)
    # NOTE: each sentence is masked once, however many entities it holds: masked per entity, a
    # long message without sentence ends was masked whole once per entity (quadratic).
    snippets: dict[int, str] = {}
    for start, _end, kind, raw in _scan(text, MAX_ENTITY_SPANS):
        value = _mask(kind, raw) if kind in _PERSONAL else raw
        if (kind, value) in seen:
            continue
        seen.add((kind, value))
        i = bisect_right(starts, start) - 1
        if i not in snippets:
            snippets[i] = _snippet(text[starts[i] : starts[i + 1] if i + 1 < len(starts) else len(text)])
        out.append(Entity(kind=kind, value=value, snippet=snippets[i]))
    return out


def format_entity(entity: Entity) -> str:
    """One line of the entity table: ``- id: ORD-48213 ("My order ORD-48213 never arrived.")``."""
    if entity.snippet and entity.snippet != entity.value:
        return f'- {entity.kind}: {entity.value} ("{entity.snippet}")'
    return f"- {entity.kind}: {entity.value}"
