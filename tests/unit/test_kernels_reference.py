"""The torch reference of the fused memory scoring against a brute-force Python oracle (loops)."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from recallserve.kernels import SHARED_TENANT, ScoreParams, TopKResult, fused_topk, reference_fused_topk
from tests.conftest import assert_close, assert_topk_equal
from tests.kernels._data import NOW, make_block, onehot_block

# NOTE: the oracle works in float64, the reference in float32 (D <= 769): 1e-5 covers the
# accumulated rounding of a unit-vector dot product.
ATOL, RTOL = 1e-5, 1e-5

MODES = [
    ScoreParams(),
    ScoreParams(decay="exponential", half_life_days=7.0, combine="weighted", similarity_weight=0.6),
    ScoreParams(decay="none", threshold=0.0),
    ScoreParams(decay="hyperbolic", decay_lambda=0.5, combine="weighted", threshold=0.5),
]


def oracle(block: dict, k: int, params: ScoreParams) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Obviously-correct loops: (scores, rows, cosines) ``[Q, k]`` padded with -inf / -1 / nan."""
    q = block["queries"].double().numpy()
    v = block["vectors"].double().numpy()
    days = block["days_since_use"].double().numpy()
    tenant = block["tenant"].numpy()
    src = block["source_id"].numpy()
    exp = block["expires_at"].numpy()
    valid = block["valid"].numpy()
    qt = block["query_tenant"].numpy()
    out_s = np.full((len(q), k), -np.inf)
    out_r = np.full((len(q), k), -1)
    out_c = np.full((len(q), k), np.nan)
    for i in range(len(q)):
        qn = q[i] / max(math.sqrt(float(q[i] @ q[i])), 1e-12)
        best: dict[int, tuple[float, int, float]] = {}
        for n in range(len(v)):
            if not valid[n] or not exp[n] > block["now"]:
                continue
            if tenant[n] != qt[i] and tenant[n] != SHARED_TENANT:
                continue
            c = float(qn @ v[n])
            if c < params.threshold:
                continue
            age = max(float(days[n]), 0.0)
            if params.decay == "hyperbolic":
                f = 1.0 / (1.0 + params.decay_lambda * age)
            elif params.decay == "exponential":
                f = 0.5 ** (age / params.half_life_days)
            else:
                f = 1.0
            w = params.similarity_weight
            s = c * f if params.combine == "product" else w * c + (1 - w) * f
            cur = best.get(int(src[n]))
            if cur is None or s > cur[0] or (s == cur[0] and n < cur[1]):
                best[int(src[n])] = (s, n, c)
        ranked = sorted(best.values(), key=lambda t: (-t[0], t[1]))[:k]
        for j, (s, n, c) in enumerate(ranked):
            out_s[i, j], out_r[i, j], out_c[i, j] = s, n, c
    return out_s, out_r, out_c


@pytest.mark.parametrize("mode", range(len(MODES)))
@pytest.mark.parametrize(("n", "d", "q", "k"), [(1, 8, 2, 3), (37, 16, 4, 5), (300, 33, 5, 20)])
def test_reference_matches_oracle(mode: int, n: int, d: int, q: int, k: int) -> None:
    block = make_block(seed=n * 10 + mode, n=n, d=d, q=q)
    params = MODES[mode]
    res = reference_fused_topk(**block, k=k, params=params)
    s, r, c = oracle(block, k, params)
    assert_topk_equal(res.scores, res.indices, s, r, atol=ATOL, rtol=RTOL)
    assert_close(res.similarity, c, atol=ATOL, rtol=RTOL, name="similarity")
    assert res.scores.dtype == torch.float32 and res.indices.dtype == torch.int64
    assert res.similarity.dtype == torch.float32 and res.time_factor.dtype == torch.float32


def test_oracle_test_data_is_not_trivial() -> None:
    """The random blocks must exercise every mask and dedup, or the comparisons prove little."""
    block = make_block(seed=7, n=300, d=33, q=5)
    s, r, _ = oracle(block, 20, ScoreParams())
    assert (r >= 0).sum() > 30, "too few candidates pass the threshold"
    # The masks and the dedup must change the answer: for some query, a row that the masks remove
    # (invalid, expired, another tenant) is among the best cosines, and two rows that pass every
    # mask share a source id (so the dedup has to pick one).
    q = torch.nn.functional.normalize(block["queries"].double(), dim=1)
    cos = (q @ block["vectors"].double().T).numpy()
    masked = ~(block["valid"].numpy() & (block["expires_at"].numpy() > block["now"]))
    other_tenant = (block["tenant"].numpy()[None, :] != block["query_tenant"].numpy()[:, None]) & (
        block["tenant"].numpy()[None, :] != SHARED_TENANT)
    removed = masked[None, :] | other_tenant
    top = np.argsort(-cos, axis=1)[:, :20]
    assert np.take_along_axis(removed, top, axis=1).any(), "no masked row would rank in the top-k"
    src = block["source_id"].numpy()
    passing = (~removed) & (cos >= ScoreParams().threshold)
    assert any(len(set(src[row].tolist())) < int(row.sum()) for row in passing), "no duplicate source among passing rows"
    assert len(set(src.tolist())) < len(src), "no duplicate source ids"
    assert (block["tenant"] == SHARED_TENANT).any() and (~block["valid"]).any()
    assert (block["expires_at"] <= NOW).any()


def test_exact_ties_go_to_lower_row() -> None:
    block = onehot_block(seed=3, n=200, d=6, q=4, n_sources=60)
    for params in (ScoreParams(), ScoreParams(decay="none"), MODES[1]):
        res = reference_fused_topk(**block, k=30, params=params)
        s, r, _ = oracle(block, 30, params)
        assert_topk_equal(res.scores, res.indices, s, r, atol=1e-6, rtol=0, exact_ties=True)


def test_one_source_crowding_the_top_forces_a_wider_prefix() -> None:
    """500 copies of the best source ahead of all: the first prefix holds 1 distinct source."""
    block = make_block(seed=11, n=800, d=16, q=3, n_sources=400)
    qn = block["queries"] / block["queries"].norm(dim=1, keepdim=True)
    block["vectors"][:500] = qn[0]
    block["source_id"][:500] = 999_999
    block["tenant"][:500] = SHARED_TENANT
    block["valid"][:500] = True
    block["expires_at"][:500] = math.inf
    res = reference_fused_topk(**block, k=10)
    s, r, _ = oracle(block, 10, ScoreParams())
    assert_topk_equal(res.scores, res.indices, s, r, atol=ATOL, rtol=RTOL)
    assert (res.indices[0] >= 0).sum() >= 2
    assert (res.indices[0] < 500).sum() == 1  # exactly one row of the crowding source


@pytest.mark.parametrize("tile", [64, 300])
def test_row_chunks_merge_exactly(monkeypatch: pytest.MonkeyPatch, tile: int) -> None:
    """Tiny tiles force many row chunks (tile // Q rows each), incl. a source crowding them all."""
    import recallserve.kernels.reference as ref_mod

    monkeypatch.setattr(ref_mod, "_MAX_TILE_ELEMENTS", tile)
    block = make_block(seed=21, n=400, d=16, q=4, n_sources=60)
    qn = block["queries"] / block["queries"].norm(dim=1, keepdim=True)
    block["vectors"][::3] = qn[1]  # one row in three, across every chunk
    block["source_id"][::3] = 77
    for params in (ScoreParams(), MODES[1]):
        res = reference_fused_topk(**block, k=12, params=params)
        s, r, c = oracle(block, 12, params)
        assert_topk_equal(res.scores, res.indices, s, r, atol=ATOL, rtol=RTOL)
        assert_close(res.similarity, c, atol=ATOL, rtol=RTOL, name="similarity")


def test_handmade_case() -> None:
    v = torch.tensor([[1.0, 0.0], [1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [1.0, 0.0]])
    res = reference_fused_topk(
        queries=torch.tensor([[2.0, 0.0]]),
        vectors=v,
        days_since_use=torch.tensor([10.0, 0.0, 0.0, 0.0, 0.0]),
        tenant=torch.tensor([5, 0, 5, 5, 6]),
        source_id=torch.tensor([1, 1, 2, 3, 4]),
        expires_at=torch.full((5,), math.inf, dtype=torch.float64),
        query_tenant=torch.tensor([5]),
        now=NOW,
        k=4,
    )
    # row 0 (cos 1, f 0.5) loses dedup to row 1 (cos 1, f 1); row 2 cos 0.6; row 3 cos 0 < 0.35;
    # row 4 belongs to tenant 6.
    assert res.indices.tolist() == [[1, 2, -1, -1]]
    assert_close(res.scores, [[1.0, 0.6, -math.inf, -math.inf]], atol=1e-6, rtol=0, name="scores")
    assert_close(res.time_factor, [[1.0, 1.0, math.nan, math.nan]], atol=1e-6, rtol=0, name="f")
    assert isinstance(res, TopKResult)


def test_empty_block_and_all_masked() -> None:
    block = make_block(seed=1, n=0, d=8, q=3)
    res = fused_topk(**block, k=4)
    assert res.indices.shape == (3, 4) and (res.indices == -1).all()
    assert torch.isneginf(res.scores).all() and res.similarity.isnan().all()
    block = make_block(seed=1, n=50, d=8, q=3)
    block["valid"][:] = False
    res = fused_topk(**block, k=4)
    assert (res.indices == -1).all() and res.time_factor.isnan().all()


def _args() -> dict:
    return make_block(seed=0, n=10, d=4, q=2)


@pytest.mark.parametrize(
    ("name", "bad", "message"),
    [
        ("queries", torch.zeros(2, 4, dtype=torch.float64), "queries must have dtype"),
        ("queries", torch.zeros(2, 5), "dim"),
        ("vectors", torch.zeros(10), "vectors must be 2-D"),
        ("days_since_use", torch.zeros(9), "days_since_use has 9 rows"),
        ("tenant", torch.zeros(10, dtype=torch.int32), "tenant must have dtype"),
        ("source_id", [1] * 10, "source_id must be a torch.Tensor"),
        ("expires_at", torch.zeros(10, dtype=torch.float32), "expires_at must have dtype"),
        ("query_tenant", torch.zeros(3, dtype=torch.int64), "query_tenant has 3 entries"),
        ("valid", torch.ones(10, dtype=torch.uint8), "valid must have dtype"),
        ("now", float("nan"), "now must be"),
    ],
)
def test_validation_names_the_argument(name: str, bad: object, message: str) -> None:
    args = _args()
    args[name] = bad
    with pytest.raises(ValueError, match=message):
        fused_topk(**args, k=3)


@pytest.mark.parametrize("k", [0, -1, True, 2.0])
def test_bad_k(k: object) -> None:
    with pytest.raises(ValueError, match="k must be"):
        fused_topk(**_args(), k=k)  # type: ignore[arg-type]


def test_bad_backend_and_params() -> None:
    with pytest.raises(ValueError, match="backend"):
        fused_topk(**_args(), k=3, backend="cuda")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="params"):
        fused_topk(**_args(), k=3, params={"threshold": 0.3})  # type: ignore[arg-type]
    with pytest.raises(ValidationError):
        ScoreParams(similarity_weight=1.5)
    with pytest.raises(ValidationError):
        ScoreParams(half_life_days=0)
    with pytest.raises(ValidationError):
        ScoreParams(treshold=0.3)  # type: ignore[call-arg]


def test_torch_path_never_imports_triton() -> None:
    """With triton made unimportable, the public API still imports and answers on CPU."""
    code = (
        "import sys; sys.modules['triton'] = None\n"
        "import kernels, torch\n"
        "from tests.kernels._data import make_block\n"
        "b = make_block(seed=0, n=20, d=8, q=2)\n"
        "assert not kernels.triton_available()\n"
        "r = kernels.fused_topk(**b, k=3)\n"
        "r = kernels.fused_topk(**b, k=3, backend='torch')\n"
        "assert r.indices.shape == (2, 3)\n"
        "assert sys.modules['triton'] is None\n"
        "try:\n"
        "    kernels.fused_topk(**b, k=3, backend='triton')\n"
        "except ImportError as e:\n"
        "    assert 'recallserve[gpu]' in str(e), e\n"
        "else:\n"
        "    raise AssertionError('no ImportError')\n"
    )
    root = Path(__file__).resolve().parents[2]
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=root, env=dict(os.environ, PYTHONPATH=str(root)),
        capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("tile", [64, 257])
def test_dense_slices_and_shrinking_merge_exactly(monkeypatch: pytest.MonkeyPatch, tile: int) -> None:
    """Low thresholds take the dense-slice path; a tiny survivor cap forces the top-k shrinking."""
    import recallserve.kernels.reference as ref_mod

    monkeypatch.setattr(ref_mod, "_MAX_TILE_ELEMENTS", tile)
    monkeypatch.setattr(ref_mod, "_MAX_SURVIVORS", 10)
    monkeypatch.setattr(ref_mod, "_DENSE_TILE_ELEMENTS", 16)
    block = make_block(seed=22, n=400, d=16, q=4, n_sources=60)
    qn = block["queries"] / block["queries"].norm(dim=1, keepdim=True)
    block["vectors"][::3] = qn[1]
    block["source_id"][::3] = 77
    for params in (ScoreParams(threshold=-1.0), ScoreParams(threshold=0.0), MODES[1]):
        res = reference_fused_topk(**block, k=12, params=params)
        s, r, c = oracle(block, 12, params)
        assert_topk_equal(res.scores, res.indices, s, r, atol=ATOL, rtol=RTOL)
        assert_close(res.similarity, c, atol=ATOL, rtol=RTOL, name="similarity")
