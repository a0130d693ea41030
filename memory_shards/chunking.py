"""Split a long text into overlapping chunks of at most N tokens, as character spans of the text.

A memory's main text longer than the embedder reads (MiniLM: 256 word pieces, the rest is cut)
is embedded as several rows, one per chunk, all rows of one record: the shard's per-source dedup
keeps the best chunk's score, and the search returns the whole record. Chunks are stored as
``(start, end)`` character offsets into the text (:attr:`MemoryRecord.text_chunks`), so the
record holds its text once and every row can be re-embedded from it (a re-embed job, a replay).

Token count: ``\\w+`` runs and single punctuation marks (``[^\\w\\s]``). NOTE: on the LoCoMo dev
turns this estimate is within 2% of MiniLM's word-piece count (13,340 vs 13,604 for one
conversation); ``DEFAULT_CHUNK_TOKENS = 224`` leaves 30 pieces of the model's 254 (256 less
[CLS] and [SEP]) for texts whose words split into more pieces than usual.

Algorithm (greedy over sentences, so a chunk starts and ends at a sentence when it can)::

    sentences = split after . ! ? or a newline
    a sentence longer than max_tokens is cut into windows of max_tokens tokens
    chunk = consecutive sentences while their tokens <= max_tokens
    the next chunk starts with the last sentences of the previous one that fit in overlap_tokens

A text of at most ``max_tokens`` tokens is one chunk (no spans are stored for it). A sentence cut
into windows (a text without punctuation) has no overlap between its windows.
"""

from __future__ import annotations

import re

__all__ = ["DEFAULT_CHUNK_TOKENS", "DEFAULT_OVERLAP_TOKENS", "MAX_CHUNKS", "chunk_spans", "count_tokens"]

DEFAULT_CHUNK_TOKENS = 224
DEFAULT_OVERLAP_TOKENS = 32
"""NOTE: ~1-2 sentences of overlap, so a fact that straddles a boundary is whole in one chunk."""
MAX_CHUNKS = 256
"""NOTE: a 32,000-character text (the record bound) has ~7,000 tokens: ~36 chunks of 224 with
overlap; 256 bounds the rows of one record even for texts of one-character tokens."""

_TOKEN = re.compile(r"\w+|[^\w\s]", re.UNICODE)
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+|\n+")


def count_tokens(text: str) -> int:
    """Estimated model tokens of ``text`` (word runs and punctuation marks)."""
    return sum(1 for _ in _TOKEN.finditer(text))


def _pieces(text: str, max_tokens: int) -> list[tuple[int, int, int]]:
    """Sentences as (start, end, tokens), a sentence over ``max_tokens`` cut into token windows."""
    out: list[tuple[int, int, int]] = []
    start = 0
    bounds = [m.end() for m in _SENTENCE_END.finditer(text)] + [len(text)]
    for end in bounds:
        if end <= start:
            continue
        tokens = [(m.start() + start, m.end() + start) for m in _TOKEN.finditer(text[start:end])]
        for i in range(0, len(tokens), max_tokens):
            window = tokens[i : i + max_tokens]
            # NOTE: a window ends where its last token ends, the next starts at its first token,
            # so whitespace between windows belongs to neither (spans stay exact substrings).
            out.append((window[0][0] if i else start, window[-1][1] if i + max_tokens < len(tokens) else end, len(window)))
        start = end
    return [p for p in out if p[2] > 0]


def chunk_spans(text: str, max_tokens: int = DEFAULT_CHUNK_TOKENS,
                overlap_tokens: int = DEFAULT_OVERLAP_TOKENS) -> list[tuple[int, int]]:
    """Character spans of ``text``'s chunks; ``[]`` when the text fits in one chunk.

    Args:
        text: the text to split.
        max_tokens: most estimated tokens per chunk (>= 16).
        overlap_tokens: tokens of trailing sentences repeated at the start of the next chunk
            (0 <= overlap < max_tokens / 2).

    Returns:
        ``[(start, end), ...]`` in text order, covering every token of the text, at most
        :data:`MAX_CHUNKS` (the last chunk then runs to the end of the text).

    Example:
        >>> spans = chunk_spans("One two. " * 200, max_tokens=64, overlap_tokens=8)
        >>> len(spans) > 1 and spans[0][0] == 0
        True
    """
    if max_tokens < 16:
        raise ValueError(f"max_tokens: must be >= 16, got {max_tokens}")
    if not 0 <= overlap_tokens < max_tokens / 2:
        raise ValueError(f"overlap_tokens: must be in [0, max_tokens / 2), got {overlap_tokens}")
    if count_tokens(text) <= max_tokens:
        return []
    pieces = _pieces(text, max_tokens)
    spans: list[tuple[int, int]] = []
    i = 0
    while i < len(pieces):
        if len(spans) == MAX_CHUNKS - 1:
            spans.append((pieces[i][0], len(text)))
            break
        j, used = i, 0
        while j < len(pieces) and used + pieces[j][2] <= max_tokens:
            used += pieces[j][2]
            j += 1
        end = pieces[j - 1][1]
        while end > pieces[i][0] and text[end - 1].isspace():
            end -= 1
        spans.append((pieces[i][0], end))
        if j >= len(pieces):
            break
        # back up over whole trailing pieces that fit in the overlap, never to or before i
        back, k = 0, j
        while k - 1 > i and back + pieces[k - 1][2] <= overlap_tokens:
            k -= 1
            back += pieces[k][2]
        i = k
    return spans
