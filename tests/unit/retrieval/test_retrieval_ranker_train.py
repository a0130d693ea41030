"""Fitting the learned ranker: the coefficients follow the labels, and bad rows are refused."""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the ranker-train extra (scikit-learn) is not installed")

from recallserve.memory_shards.retrieval.ranker import FEATURES  # noqa: E402
from recallserve.memory_shards.retrieval.ranker_train import fit_ranker  # noqa: E402


def test_the_fitted_model_ranks_by_the_feature_that_predicts_the_label() -> None:
    rng = np.random.default_rng(0)
    x = rng.random((2000, len(FEATURES)))
    named = FEATURES.index("speaker_named")
    x[:, named] = rng.random(2000) < 0.3
    y = (x[:, named] > 0) & (rng.random(2000) < 0.8)
    model = fit_ranker(x, y.astype(np.int8), {"conversations": ["synthetic"]})
    assert max(range(len(FEATURES)), key=lambda j: model.coef[j]) == named
    assert model.order(x)[0] in np.flatnonzero(x[:, named])
    assert model.trained == {"conversations": ["synthetic"]}


def test_bad_rows_are_refused() -> None:
    with pytest.raises(ValueError, match="x: expected"):
        fit_ranker(np.zeros((3, 2)), np.array([0, 1, 0]))
    with pytest.raises(ValueError, match="positive and negative"):
        fit_ranker(np.zeros((3, len(FEATURES))), np.zeros(3))
