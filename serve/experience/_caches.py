"""Cache policy of the experience memory: ranking, soft decay, demotion, conflicts, model family.

Pure functions over :class:`~._store.StoredRow` lists, so every rule is unit-testable
without a database:

* **Active ranking**: ``score = w_r x recency + w_s x similarity`` with ``w_r = 0.7``,
  ``w_s = 0.3`` (hybrid: the similarity term is the keyword + vector fusion, see :func:`rank_active`);
  ``recency = 1 - rank / (n - 1)`` where rank 0 is the newest record (by its ``metadata.timestamp``,
  the design's "time first": records retrieved together no longer tie) of the ``n`` candidates
  (``recency = 1`` when ``n = 1``); similarity is the cosine of the L2-normalised embeddings,
  clipped at 0.
* **Window**: an active record older than 30 days (by its own time) sinks to archival, where its
  topic path still finds it (002: "30 days later it sinks into the Archival Cache").
* **Soft decay**: ``decay = 1 / (1 + 0.1 x days since last use)``; below 0.3 (about 23 days unused)
  a record becomes a demotion *candidate* (002's word), demoted first when its scope is over
  capacity, not at once (else the 30-day window never acts).
* **Capacity**: per tenant and domain, the least recently used records beyond the
  capacity (50-200) are demoted.
* **Domains**: per tenant, the active records of the least recently used task domains beyond
  ``max_active_domains`` are demoted, so the active tier of a tenant is bounded by
  ``max_active_domains x capacity`` whatever labels its clients send.
* **Source model**: an experience is reused only by the model that wrote it (:func:`reuse_key`; the
  design's account of a 72B trace that misled a 7B model), unless configuration names the family
  whose sizes share (``experience.shared_families``).
* **Conflicts**: an active record older than a newer, not-wrong archival record on the same
  topic (same domain and model family) raises an alert and the newer one is preferred.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from recallserve.memory_shards.retrieval import RRF_K, rrf_fuse
from recallserve.serve.experience._store import StoredRow

__all__ = ["decay_factor", "rank_active", "demotions", "evicted_domains", "find_conflicts", "model_family", "model_key",
           "reuse_key", "Ranked", "Conflict"]

_DAY = 86400.0
_SIZE = re.compile(r"^\d+(?:\.\d+)?[bmk]$")
_DROP = {"instruct", "chat", "it", "gguf", "hf", "awq", "gptq", "fp16", "bf16", "int4", "int8"}
_QUANT = re.compile(r"^(?:q\d.*|iq\d.*|f16|f32)$")


def model_family(model_name: str) -> str:
    """Family of a model name: path, extension, size, quantisation and chat suffixes removed.

    Experiences are reused only within a family: a trace written by one family's habits
    (formats, typical mistakes) is not evidence for another's.

    Example:
        >>> model_family("models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf")
        'qwen2.5-coder'
        >>> model_family("qwen2.5-coder-0.5b-instruct")
        'qwen2.5-coder'
    """
    base = model_name.strip().replace("\\", "/").rsplit("/", 1)[-1].lower()
    base = re.sub(r"\.(gguf|bin|safetensors)$", "", base)
    tokens = [t for t in re.split(r"[-_\s:]+", base) if t]
    kept: list[str] = []
    for t in tokens:
        if _SIZE.match(t) or _QUANT.match(t):
            break
        if t not in _DROP:
            kept.append(t)
    return "-".join(kept) or base or "unknown"


_FORMAT = {"gguf", "hf", "awq", "gptq", "fp16", "bf16", "int4", "int8"}


def model_key(model_name: str) -> str:
    """One model's name, normalised: path, extension, file format and quantisation removed; size and
    instruct/chat kept (another size or tuning is another model).

    Example:
        >>> model_key("models/Qwen2.5-Coder-1.5B-Instruct-Q4_K_M.gguf")
        'qwen2.5-coder-1.5b-instruct'
        >>> model_key("qwen2-72b-instruct") == model_key("qwen2-7b-instruct")
        False
    """
    base = model_name.strip().replace("\\", "/").rsplit("/", 1)[-1].lower()
    base = re.sub(r"\.(gguf|bin|safetensors)$", "", base)
    kept: list[str] = []
    for t in (t for t in re.split(r"[-_\s:]+", base) if t):
        if _QUANT.match(t):
            break  # NOTE: a quantisation suffix ends the name (Q4_K_M splits into q4, k, m)
        if t not in _FORMAT:
            kept.append(t)
    return "-".join(kept) or base or "unknown"


def reuse_key(model_name: str, shared_families: Sequence[str] = ()) -> str:
    """Who may reuse an experience of ``model_name``: its own model (:func:`model_key`), or its whole
    family (:func:`model_family`) when configuration lists the family in ``shared_families``.

    Example:
        >>> reuse_key("qwen2-72b-instruct"), reuse_key("qwen2-72b-instruct", ["qwen2"])
        ('qwen2-72b-instruct', 'family:qwen2')
    """
    family = model_family(model_name)
    return f"family:{family}" if family in shared_families else model_key(model_name)


def decay_factor(now: float, last_used_at: float, rate: float = 0.1) -> float:
    """``1 / (1 + rate x days since last use)``; 1.0 for a record used now (or in the future)."""
    days = max(0.0, (now - last_used_at) / _DAY)
    return 1.0 / (1.0 + rate * days)


@dataclass
class Ranked:
    """An active candidate with its score parts."""

    row: StoredRow
    score: float
    similarity: float
    recency: float
    decay: float


def rank_active(
    rows: Sequence[StoredRow], query: np.ndarray, *, now: float, k: int, recency_weight: float = 0.7,
    min_similarity: float = 0.0, decay_rate: float = 0.1, keyword_ranking: Sequence[str] | None = None,
) -> list[Ranked]:
    """Top-``k`` active rows by ``w_r x recency rank + (1 - w_r) x similarity``.

    Rows below ``min_similarity`` are not candidates (so an unrelated but recent record is
    never injected); the recency rank is taken among the remaining candidates. Ties break by
    the more recent use, then by id.

    Hybrid (``keyword_ranking``: row ids best first by BM25 over the same rows): a row is a
    candidate when it passes ``min_similarity`` or the keyword search found it, and its
    similarity term is the reciprocal rank fusion of the two rankings, as in the memory tier
    (:func:`recallserve.memory_shards.retrieval.rrf_fuse`, ``c = 60``), scaled to [0, 1] by the best possible
    fused score (first in both lists): ``rel = rrf / (2 / (c + 1))``. ``Ranked.similarity``
    stays the cosine.
    """
    if not rows or k <= 0:
        return []
    emb = np.stack([r.embedding for r in rows]).astype(np.float32)
    sims = np.clip(emb @ np.asarray(query, dtype=np.float32).reshape(-1), 0.0, 1.0)
    keyword = set(keyword_ranking or ())
    cands = [(r, float(s)) for r, s in zip(rows, sims, strict=True) if s >= min_similarity or r.id in keyword]
    if not cands:
        return []
    relevance = {r.id: s for r, s in cands}
    if keyword_ranking is not None:
        dense = [r.id for r, s in sorted(cands, key=lambda c: (-c[1], c[0].id)) if s >= min_similarity]
        lexical = [i for i in keyword_ranking if i in relevance]
        best = 2.0 / (RRF_K + 1.0)
        fused = dict(rrf_fuse([dense, lexical]))
        relevance = {i: fused.get(i, 0.0) / best for i in relevance}
    # NOTE: recency rank over candidates, newest record first (its own time, not its last use:
    # records retrieved together were all "used now" and tied); ids break equal timestamps so the
    # ranking is deterministic.
    order = sorted(range(len(cands)), key=lambda i: (-cands[i][0].record.metadata.timestamp, cands[i][0].id))
    n = len(cands)
    recency = np.empty(n)
    for rank, i in enumerate(order):
        recency[i] = 1.0 if n == 1 else 1.0 - rank / (n - 1)
    out = [
        Ranked(row=r, similarity=s, recency=float(recency[i]), decay=decay_factor(now, r.last_used_at, decay_rate),
               score=recency_weight * float(recency[i]) + (1.0 - recency_weight) * relevance[r.id])
        for i, (r, s) in enumerate(cands)
    ]
    out.sort(key=lambda x: (-x.score, -x.row.record.metadata.timestamp, x.row.id))
    return out[:k]


def demotions(
    rows: Sequence[StoredRow], *, now: float, capacity: int, window_days: float, demote_below: float = 0.3,
    decay_rate: float = 0.1,
) -> dict[str, str]:
    """Active rows of one (tenant, domain) scope to demote, ``{id: reason}``.

    Reasons: ``window`` (the record is older than ``window_days``, by its own time), ``decay`` (over
    ``capacity``: a candidate whose decay factor fell below ``demote_below`` goes first),
    ``capacity`` (then the least recently used beyond ``capacity``).
    """
    out: dict[str, str] = {}
    keep: list[StoredRow] = []
    for r in rows:
        if now - r.record.metadata.timestamp > window_days * _DAY:
            out[r.id] = "window"
        else:
            keep.append(r)
    candidate = {r.id for r in keep if decay_factor(now, r.last_used_at, decay_rate) < demote_below}
    keep.sort(key=lambda r: (r.id in candidate, -r.last_used_at, r.id))
    for r in keep[capacity:]:
        out[r.id] = "decay" if r.id in candidate else "capacity"
    return out


def evicted_domains(domains: Sequence[tuple[str, float]], capacity: int, keep: str | None = None) -> list[str]:
    """Task domains of one tenant's active tier to demote whole: the least recently used (``last use``
    of their most recent record) beyond ``capacity``. ``keep`` (the domain just written) always stays,
    whatever its records' timestamps; ties break by name, so every replica picks the same domains.

    Example:
        >>> evicted_domains([("units", 30.0), ("tax", 20.0), ("math", 10.0)], 2, keep="math")
        ['tax']
    """
    over = len(domains) - capacity
    if over <= 0:
        return []
    order = sorted(domains, key=lambda d: (d[0] == keep, d[1], d[0]))
    return [name for name, _ in order[:over]]


@dataclass
class Conflict:
    """An active record superseded by a newer archival record on the same topic."""

    active: StoredRow
    newer: StoredRow


def find_conflicts(active: Sequence[StoredRow], archival: Sequence[StoredRow]) -> list[Conflict]:
    """For each active row, the newest archival row of the same topic, domain and family that is
    newer (by creation time) and not labelled wrong."""
    best: dict[tuple[str, str, str], StoredRow] = {}
    for a in archival:
        md = a.record.metadata
        if a.record.evaluation.human_label == "wrong":
            continue
        key = (md.topic, md.task_domain, a.family)
        if key not in best or md.timestamp > best[key].record.metadata.timestamp:
            best[key] = a
    out = []
    for r in active:
        md = r.record.metadata
        newer = best.get((md.topic, md.task_domain, r.family))
        if newer is not None and newer.record.metadata.timestamp > md.timestamp:
            out.append(Conflict(active=r, newer=newer))
    return out
