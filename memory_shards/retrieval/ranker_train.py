"""Fitting the learned ranker (:mod:`~recallserve.memory_shards.retrieval.ranker`): logistic regression.

Rows are the fused candidates of the training questions (``HybridRetriever.features``), labelled 1 when
the candidate is one of the question's evidence memories. The model is scikit-learn's L2 logistic
regression on standardised features (``z_j = (x_j - mean_j) / scale_j``), minimising::

    sum_i log(1 + exp(-y_i * (w . z_i + b))) + ||w||^2 / (2 C)          y in {-1, +1}, C = 1

C = 1 is scikit-learn's default, never tuned. Pointwise rather than pairwise: the fused list's order
is what is re-ranked, and a pointwise logit is a single dot product per candidate at search time.
Needs scikit-learn (the ``ranker-train`` extra); serving only needs numpy.
"""

from __future__ import annotations

import numpy as np
from sklearn.linear_model import LogisticRegression

from .ranker import FEATURES, RankerModel

__all__ = ["fit_ranker"]


def fit_ranker(x: np.ndarray, y: np.ndarray, trained: dict | None = None, c: float = 1.0) -> RankerModel:
    """A :class:`RankerModel` fitted to rows ``x`` ([n, len(FEATURES)]) and 0/1 labels ``y``.

    Raises:
        ValueError: shapes that do not match, or labels of a single class.
    """
    if x.ndim != 2 or x.shape[1] != len(FEATURES) or len(y) != len(x):
        raise ValueError(f"x: expected [n, {len(FEATURES)}] with n = len(y) = {len(y)}, got {x.shape}")
    if len(set(np.asarray(y).tolist())) < 2:
        raise ValueError("y: needs positive and negative candidates")
    mean = x.mean(axis=0)
    # NOTE: a constant feature (e.g. no question names a time) gets scale 1, so its coefficient stays 0.
    scale = np.where(x.std(axis=0) > 1e-9, x.std(axis=0), 1.0)
    lr = LogisticRegression(C=c, max_iter=2000)
    lr.fit((x - mean) / scale, y)
    return RankerModel(features=list(FEATURES), mean=[round(float(v), 6) for v in mean],
                       scale=[round(float(v), 6) for v in scale], coef=[round(float(v), 6) for v in lr.coef_[0]],
                       intercept=round(float(lr.intercept_[0]), 6), trained=trained or {})
