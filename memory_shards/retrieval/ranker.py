"""A learned ranker over the fused candidates: per-candidate features, a logistic model, re-ordering.

The fusion (:mod:`~recallserve.memory_shards.retrieval.hybrid`) ranks by fixed RRF weights. Most missed
evidence is already among the fused candidates, only too low (``loadtests/results/locomo-dev-candidates-loo.md``:
67 of 98 missed multi-hop evidence turns are among a main list's first 64). The ranker re-orders the
first ``rerank_depth`` fused hits by a score learned from what the retrieval already knows about each
candidate, with no model call and no shard call::

    x(d)     = the features below, for candidate d of the query's fused list
    z(d)     = sum_j coef_j * (x_j(d) - mean_j) / scale_j + intercept          (logistic regression)
    order    = by z desc (ties: fused order); the first k are returned

Features (``FEATURES``; each cheap, from the hit, the query and the other candidates):

- ``rrf_rel``: fused RRF score / the best fused score of the query; ``fused_pos``: ln(1 + 0-based fused position)
- ``cos``: cosine of the best-matching row; ``cos_gap``: cos - the best cosine among the candidates
- ``dense_rr`` / ``lex_rr``: 10 / (10 + rank) in the main dense / BM25 list (0 when absent)
- ``bm25_rel``: BM25 / the best BM25 among the candidates (0 when absent)
- ``speaker_named``: ``metadata[name_key]`` is a name the query names; ``other_named``: the query names
  someone and this candidate's speaker is someone else
- ``topic_top``: how many of the other first-5 fused hits share this candidate's ``topic_path`` (/ 5):
  the same conversation session or topic as the strongest hits
- ``in_window``: written inside the time the query names (``when.query_time_window``, plus slack)
- ``context_part``: the best-matching row is not the main text (a context or other part)
- ``recency``: created-at scaled to [0, 1] among the candidates (0 oldest)
- ``log_len``: ln(1 + characters of the main text) / 8
- ``overlap``: share of the query's index terms (stems, :func:`~._text.analyse`) found in the main text

The model ships as a JSON file in the package (``ranker_model.json``: feature names, standardisation and
coefficients; no pickle), written by ``recallserve eval ranker`` (``deployments/cli/_eval_ranker.py``), which
also reports the leave-one-conversation-out figures it was judged by.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from functools import lru_cache
from pathlib import Path
from typing import Protocol

import numpy as np
from pydantic import Field, model_validator

from recallserve.kernels import StrictModel

from ..records import MemoryRecord
from ._text import analyse
from .when import TimeWindow

__all__ = ["FEATURES", "Candidate", "RankerModel", "candidate_features", "load_ranker", "PACKAGED_RANKER"]


class Candidate(Protocol):
    """What the features read of a fused hit (``hybrid.HybridHit`` has it)."""

    record: MemoryRecord
    score: float
    similarity: float
    part_index: int
    dense_rank: int | None
    lexical_rank: int | None
    lexical_score: float | None

FEATURES: tuple[str, ...] = (
    "rrf_rel", "fused_pos", "cos", "cos_gap", "dense_rr", "lex_rr", "bm25_rel", "speaker_named", "other_named",
    "topic_top", "in_window", "context_part", "recency", "log_len", "overlap",
)
"""Feature names, in column order (see the module docstring)."""

PACKAGED_RANKER = Path(__file__).with_name("ranker_model.json")
"""The model the retriever uses (trained on the LoCoMo dev file by ``recallserve eval ranker``)."""

_TOP = 5
"""Fused hits a candidate's session is compared with (``topic_top``)."""


class RankerModel(StrictModel):
    """A logistic model over :data:`FEATURES` (standardised), as stored in its JSON file."""

    format: str = Field(default="recallserve-ranker/1", pattern=r"^recallserve-ranker/1$", description="File format id.")
    features: list[str] = Field(min_length=1, max_length=64, description="Feature names, in column order.")
    mean: list[float] = Field(description="Per-feature mean subtracted before scaling.")
    scale: list[float] = Field(description="Per-feature scale (> 0) divided by.")
    coef: list[float] = Field(description="Per-feature coefficient of the standardised feature.")
    intercept: float = Field(description="Logit intercept.")
    trained: dict[str, str | int | float | list[str]] = Field(default_factory=dict,
                                                            description="How it was trained (command, data, folds).")

    @model_validator(mode="after")
    def _check(self) -> RankerModel:
        n = len(self.features)
        for name in ("mean", "scale", "coef"):
            if len(getattr(self, name)) != n:
                raise ValueError(f"{name}: {len(getattr(self, name))} values for {n} features")
        if any(s <= 0 for s in self.scale):
            raise ValueError("scale: every value must be > 0")
        unknown = sorted(set(self.features) - set(FEATURES))
        if unknown:
            raise ValueError(f"features: unknown {unknown}; known: {list(FEATURES)}")
        return self

    def score(self, x: np.ndarray) -> np.ndarray:
        """Logits of the rows of ``x`` ([n, len(FEATURES)] in :data:`FEATURES` order)."""
        cols = [FEATURES.index(f) for f in self.features]
        z = (x[:, cols] - np.asarray(self.mean)) / np.asarray(self.scale)
        return z @ np.asarray(self.coef) + self.intercept

    def order(self, x: np.ndarray) -> np.ndarray:
        """Indexes of the rows of ``x`` best first (a stable sort: ties keep the fused order)."""
        return np.argsort(-self.score(x), kind="stable")


@lru_cache(maxsize=4)
def load_ranker(path: str | None = None) -> RankerModel:
    """The ranker stored at ``path`` (default: the packaged one), read once.

    Raises:
        ValueError: naming the file when it is missing or malformed.
    """
    p = Path(path) if path else PACKAGED_RANKER
    try:
        return RankerModel.model_validate(json.loads(p.read_text(encoding="utf-8")))
    except (OSError, json.JSONDecodeError) as exc:
        raise ValueError(f"ranker file {p}: {exc}") from exc


def _is_named(speaker: object, names: set[str]) -> bool:
    return isinstance(speaker, str) and (speaker in names or not names.isdisjoint(speaker.split()))


def candidate_features(query: str, hits: Sequence[Candidate], names: Sequence[str], name_key: str,
                       window: TimeWindow | None, slack_s: float) -> np.ndarray:
    """[len(hits), len(FEATURES)] features of the fused ``hits`` (best first) for ``query``.

    ``names`` are the names the query names (``hybrid._query_names``); ``window`` the time it names (or None),
    whose end is extended by ``slack_s`` as the date lists of the fusion are.
    """
    n = len(hits)
    x = np.zeros((n, len(FEATURES)), dtype=np.float64)
    if n == 0:
        return x
    col = {f: i for i, f in enumerate(FEATURES)}
    fused = np.array([h.score for h in hits])
    cos = np.array([h.similarity for h in hits])
    bm25 = np.array([h.lexical_score or 0.0 for h in hits])
    created = np.array([h.record.created_at for h in hits])
    x[:, col["rrf_rel"]] = fused / fused.max() if fused.max() > 0 else 0.0
    x[:, col["fused_pos"]] = np.log1p(np.arange(n))
    x[:, col["cos"]] = cos
    x[:, col["cos_gap"]] = cos - cos.max()
    x[:, col["dense_rr"]] = [10.0 / (10.0 + h.dense_rank) if h.dense_rank else 0.0 for h in hits]
    x[:, col["lex_rr"]] = [10.0 / (10.0 + h.lexical_rank) if h.lexical_rank else 0.0 for h in hits]
    x[:, col["bm25_rel"]] = bm25 / bm25.max() if bm25.max() > 0 else 0.0
    name_set = set(names)
    if name_set:
        spk = [h.record.metadata.get(name_key) for h in hits]
        x[:, col["speaker_named"]] = [_is_named(s, name_set) for s in spk]
        x[:, col["other_named"]] = [isinstance(s, str) and not _is_named(s, name_set) for s in spk]
    top = [h.record.topic_path for h in hits[:_TOP]]
    x[:, col["topic_top"]] = [
        (sum(t == h.record.topic_path for t in top) - (i < _TOP)) / _TOP if h.record.topic_path else 0.0
        for i, h in enumerate(hits)]
    if window is not None:
        x[:, col["in_window"]] = (created >= window.start) & (created < window.end + slack_s)
    x[:, col["context_part"]] = [h.part_index > 0 for h in hits]
    span = created.max() - created.min()
    x[:, col["recency"]] = (created - created.min()) / span if span > 0 else 0.0
    x[:, col["log_len"]] = [math.log1p(len(h.record.text)) / 8.0 for h in hits]
    q_terms = set(analyse(query))
    if q_terms:
        x[:, col["overlap"]] = [len(q_terms.intersection(analyse(h.record.text))) / len(q_terms) for h in hits]
    return x
