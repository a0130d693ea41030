"""Shared test helpers: a seeded RNG, an allclose that says where it differs, and a tie-aware
top-k comparison (FAISS ``check_ref_knn_with_draws`` style).

torch is imported inside the helpers so collecting non-torch tests stays fast.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import numpy as np
import pytest

# NOTE: imported first: it moves the checkout's root (that `python -m pytest` puts first on sys.path)
# behind site-packages, so a test that imports transformers gets Hugging Face's `kernels`, not kernels/.
import recallserve.kernels  # noqa: F401


def _interpret_triton_without_cuda() -> None:
    """Run Triton kernels in its interpreter when there is no GPU (``tests/kernels``).

    NOTE: TRITON_INTERPRET is read once, when triton is first imported (``@triton.jit`` picks the
    interpreter at decoration, triton's own ``tl.*`` helpers included), so it is set here, before
    any test module can import triton. With CUDA the compiled kernels run (``tests/gpu``) and
    ``tests/kernels`` skips itself unless run alone with TRITON_INTERPRET=1.
    """
    if "triton" in sys.modules or "TRITON_INTERPRET" in os.environ:
        return
    try:
        import torch
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        return
    if not torch.cuda.is_available():
        os.environ["TRITON_INTERPRET"] = "1"


_interpret_triton_without_cuda()

__all__ = ["assert_close", "assert_topk_equal", "to_numpy"]

# NOTE: fixed so a failing case reproduces; tests that loop over seeds pass their own.
DEFAULT_SEED = 1234


@pytest.fixture
def rng() -> np.random.Generator:
    """A numpy Generator seeded with ``DEFAULT_SEED`` (also seeds torch when it is installed)."""
    try:
        import torch

        torch.manual_seed(DEFAULT_SEED)
    except ImportError:  # pragma: no cover - torch is a runtime dependency
        pass
    return np.random.default_rng(DEFAULT_SEED)


def to_numpy(x: Any) -> np.ndarray:
    """A numpy copy of a tensor (any device) or array-like."""
    if hasattr(x, "detach"):
        return x.detach().cpu().numpy()
    return np.asarray(x)


def assert_close(
    actual: Any,
    expected: Any,
    *,
    atol: float,
    rtol: float,
    name: str = "value",
    max_report: int = 5,
) -> None:
    """``allclose`` with NaN == NaN and equal infinities; on failure lists the first mismatches."""
    a, e = to_numpy(actual), to_numpy(expected)
    assert a.shape == e.shape, f"{name}: shape {a.shape} != expected {e.shape}"
    ok = np.isclose(a, e, atol=atol, rtol=rtol, equal_nan=True)
    if ok.all():
        return
    bad = np.argwhere(~ok)
    lines = [
        f"  at {tuple(int(i) for i in pos)}: got {a[tuple(pos)]!r}, expected {e[tuple(pos)]!r}"
        for pos in bad[:max_report]
    ]
    raise AssertionError(
        f"{name}: {len(bad)} of {a.size} elements differ (atol={atol}, rtol={rtol})\n"
        + "\n".join(lines)
    )


def _groups(scores: np.ndarray, atol: float, rtol: float) -> list[tuple[int, int]]:
    """Runs ``[start, end)`` of consecutive finite scores equal within tolerance."""
    out: list[tuple[int, int]] = []
    j, k = 0, len(scores)
    while j < k and np.isfinite(scores[j]):
        end = j + 1
        while end < k and np.isfinite(scores[end]) and abs(scores[end] - scores[j]) <= (
            atol + rtol * abs(scores[j])
        ):
            end += 1
        out.append((j, end))
        j = end
    return out


def assert_topk_equal(
    got_scores: Any,
    got_indices: Any,
    ref_scores: Any,
    ref_indices: Any,
    *,
    atol: float,
    rtol: float,
    exact_ties: bool = False,
) -> None:
    """Compare a top-k result with a reference, allowing reordering inside near-equal scores.

    Scores must be allclose (``-inf`` padding in the same places). Within each group of
    reference scores equal up to tolerance, the row ids must match as sets. The last group of a
    full row is skipped unless ``exact_ties`` (as FAISS does: a near-tie at the cut may pick
    different rows), since float noise between backends can reorder near-ties. Use
    ``exact_ties=True`` when ties are exact by construction; then ids must match position by
    position (the tie rule is deterministic: lower row index first).
    """
    gs, gi = to_numpy(got_scores), to_numpy(got_indices)
    rs, ri = to_numpy(ref_scores), to_numpy(ref_indices)
    assert gs.shape == rs.shape and gi.shape == ri.shape, (
        f"shapes differ: got {gs.shape}/{gi.shape}, expected {rs.shape}/{ri.shape}"
    )
    assert_close(gs, rs, atol=atol, rtol=rtol, name="scores")
    pad_g, pad_r = gi < 0, ri < 0
    if not np.array_equal(pad_g, pad_r):
        q = int(np.argwhere((pad_g != pad_r).any(axis=1))[0, 0])
        raise AssertionError(f"padding differs at query {q}: got {gi[q]}, expected {ri[q]}")
    for q in range(gi.shape[0]):
        live = gi[q][gi[q] >= 0]
        assert len(set(live.tolist())) == len(live), f"query {q}: repeated rows {gi[q]}"
        if np.array_equal(gi[q], ri[q]):
            continue
        if exact_ties:
            raise AssertionError(
                f"query {q}: rows differ\n  got      {gi[q]}\n  expected {ri[q]}\n"
                f"  scores   {rs[q]}"
            )
        groups = _groups(rs[q], atol, rtol)
        for start, end in groups:
            if end == rs.shape[1] and (start, end) == groups[-1]:
                continue  # NOTE: the cut group may legitimately differ (see docstring).
            g, r = set(gi[q, start:end].tolist()), set(ri[q, start:end].tolist())
            if g != r:
                raise AssertionError(
                    f"query {q}, ranks {start}..{end - 1}: rows {sorted(g)} != expected "
                    f"{sorted(r)}\n  got      {gi[q]}\n  expected {ri[q]}\n  scores   {rs[q]}"
                )
