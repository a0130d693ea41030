"""Which language a text is in, as far as the serve layer needs to know: Chinese or not.

The design sources describe a Chinese customer-service system; the rules of context-mode, E-CoT
and the agent have Chinese forms beside the English ones (docs/languages.md). Rules match either
language without being told, so this is needed only where the server *writes* text (the rolling
summary, prompt instructions) and must pick the conversation's language:

    han_share(text) = (Han characters) / (Han characters + Latin letters)

and a text is Chinese when that share is at least :data:`CHINESE_MIN_SHARE`. Digits, ids and
punctuation count for neither, so "订单 ORD-58213 退款" is Chinese and "ORD-58213" alone is not.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from typing import Literal

from recallserve.memory_shards.retrieval._text import CJK_RUN

__all__ = ["Language", "han_share", "language_of", "has_han", "fold_width", "CHINESE_MIN_SHARE"]

Language = Literal["zh", "en"]

#: NOTE: a Chinese message that quotes English product names or ids stays Chinese (a Han character
#: carries about a word: 0.3 of the letters is already a mostly-Chinese text by words).
CHINESE_MIN_SHARE = 0.3
_LATIN = re.compile(r"[A-Za-z]")


def has_han(text: str) -> bool:
    """True when ``text`` holds at least one Han character."""
    return CJK_RUN.search(text) is not None


def han_share(text: str) -> float:
    """Han characters / (Han characters + Latin letters) of ``text``; 0.0 when it has neither.

    Example:
        >>> round(han_share("打印机 E-31"), 2)
        0.75
    """
    han = sum(len(run) for run in CJK_RUN.findall(text))
    latin = len(_LATIN.findall(text))
    return han / (han + latin) if han + latin else 0.0


def language_of(texts: str | Iterable[str]) -> Language:
    """``"zh"`` when the texts together are Chinese by :func:`han_share`, else ``"en"``.

    Example:
        >>> language_of(["我是张总", "OK"]), language_of("Hello there")
        ('zh', 'en')
    """
    joined = texts if isinstance(texts, str) else "\n".join(texts)
    return "zh" if han_share(joined) >= CHINESE_MIN_SHARE else "en"


#: Full-width digits, Latin letters and hyphen-minus (U+FF10-FF19, U+FF21-FF3A, U+FF41-FF5A, U+FF0D), as a
#: Chinese input method types them, mapped to their ASCII forms (code point - 0xFEE0).
_WIDE = {c: c - 0xFEE0 for c in (*range(0xFF10, 0xFF1A), *range(0xFF21, 0xFF3B), *range(0xFF41, 0xFF5B), 0xFF0D)}


def fold_width(text: str) -> str:
    """``text`` with full-width digits and Latin letters in their ASCII forms: "订单号１０４４２４" is order 104424.

    Only those: full-width punctuation (，？：) is how Chinese is written and stays (NFKC would fold it too).

    Example:
        >>> fold_width("订单号１０４４２４，ＳＫＵ ＫＴ－１７？")
        '订单号104424，SKU KT-17？'
    """
    return text.translate(_WIDE)
