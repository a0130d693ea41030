"""Triton fused scoring kernel (interpreted on CPU tensors) against the torch reference.

``tests/conftest.py`` sets TRITON_INTERPRET=1 before triton is imported when there is no CUDA.
The interpreter mode is fixed per process at the first ``import triton`` (see
``recallserve.kernels.fused_score._interpreting``), so on a GPU machine these tests skip; there run
``TRITON_INTERPRET=1 pytest tests/kernels`` on its own (``tests/gpu`` covers the compiled kernel).
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch
from pydantic import ValidationError

from recallserve.kernels import ScoreParams, fused_topk, reference_fused_topk
from tests.conftest import assert_close, assert_topk_equal
from tests.kernels._data import make_block, onehot_block

pytest.importorskip("triton")

from recallserve.kernels.fused_score import BlockConfig, _interpreting, triton_fused_topk  # noqa: E402

if not _interpreting():
    pytest.skip(
        "triton was imported before TRITON_INTERPRET=1 was set; run tests/kernels on its own",
        allow_module_level=True,
    )

pytestmark = pytest.mark.kernels

# NOTE: fp32 dot products over D <= 769 in a different summation order (numpy in the
# interpreter vs torch's GEMM): a few ulp of a unit-norm cosine; exp2 may differ by 1 ulp.
ATOL, RTOL = 2e-6, 1e-5

MODES = {
    "hyperbolic-product": ScoreParams(),
    "exponential-weighted": ScoreParams(
        decay="exponential", half_life_days=7.0, combine="weighted", similarity_weight=0.6
    ),
    "none-product-thr0": ScoreParams(decay="none", threshold=0.0),
    "hyperbolic-weighted-thr0.5": ScoreParams(decay_lambda=0.5, combine="weighted", threshold=0.5),
}
SMALL = BlockConfig(block_q=16, block_n=64, block_d=32)


def _compare(block: dict, k: int, params: ScoreParams, config: BlockConfig | None = None,
             exact_ties: bool = False, stats: dict | None = None) -> None:
    ref = reference_fused_topk(**block, k=k, params=params)
    got = triton_fused_topk(**block, k=k, params=params, config=config, stats=stats)
    assert_topk_equal(
        got.scores, got.indices, ref.scores, ref.indices, atol=ATOL, rtol=RTOL,
        exact_ties=exact_ties,
    )
    assert_close(got.similarity, ref.similarity, atol=ATOL, rtol=RTOL, name="similarity")
    assert_close(got.time_factor, ref.time_factor, atol=ATOL, rtol=RTOL, name="time_factor")
    for name in ("scores", "similarity", "time_factor"):
        assert getattr(got, name).dtype == torch.float32, name
    assert got.indices.dtype == torch.int64


@pytest.mark.parametrize(
    ("n", "d", "q", "k", "config"),
    [
        (1, 16, 1, 3, None),  # one row, one partial block
        (37, 383, 3, 5, None),  # non-power-of-two D, one block
        (200, 384, 5, 10, SMALL),  # 4 row blocks, D loop of 12 tiles
        (1100, 769, 4, 20, None),  # 5 row blocks, D = 769 (6 full tiles + 1 column)
        (300, 33, 20, 7, SMALL),  # two query blocks, the second partial
    ],
)
def test_matches_reference_on_awkward_shapes(n: int, d: int, q: int, k: int, config) -> None:
    _compare(make_block(seed=n + d, n=n, d=d, q=q), k, ScoreParams(), config)


@pytest.mark.parametrize("mode", list(MODES))
def test_each_decay_and_combine_mode(mode: str) -> None:
    _compare(make_block(seed=5, n=300, d=48, q=6), 12, MODES[mode], SMALL)


@pytest.mark.parametrize("seed", range(6))
def test_random_sweep(seed: int) -> None:
    """Random shapes (D from 1, N up to 1500, few or many sources), modes and tile sizes."""
    g = np.random.default_rng(seed)
    n, d, q, k = (int(g.integers(1, hi)) for hi in (1500, 300, 40, 40))
    block = make_block(seed=seed, n=n, d=d, q=q, n_sources=int(g.integers(1, n + 1)))
    _compare(block, k, list(MODES.values())[seed % len(MODES)], SMALL if seed % 2 else None)


def test_k_larger_than_candidates_pads() -> None:
    block = make_block(seed=9, n=50, d=24, q=3, n_sources=6)
    ref = reference_fused_topk(**block, k=40)
    assert (ref.indices == -1).any(dim=1).all(), "test needs padding in every query"
    _compare(block, 40, ScoreParams())


def test_all_rows_masked() -> None:
    block = make_block(seed=2, n=90, d=20, q=3)
    block["expires_at"][:] = block["now"]  # expires_at > now fails everywhere
    got = triton_fused_topk(**block, k=5)
    assert (got.indices == -1).all() and torch.isneginf(got.scores).all()
    assert got.similarity.isnan().all() and got.time_factor.isnan().all()


def test_empty_block() -> None:
    got = triton_fused_topk(**make_block(seed=2, n=0, d=20, q=3), k=5)
    assert got.indices.shape == (3, 5) and (got.indices == -1).all()


def test_one_source_crowding_every_block_is_widened_and_exact() -> None:
    """Source 424242 owns the best 40 rows of each of the 8 row blocks: the first per-block
    lists (2k = 8 slots) hold nothing else, so the exactness check must trigger a rerun."""
    block = make_block(seed=4, n=512, d=32, q=2, n_sources=200)
    qn = block["queries"] / block["queries"].norm(dim=1, keepdim=True)
    crowd = torch.cat([torch.arange(b * 64, b * 64 + 40) for b in range(8)])
    block["vectors"][crowd] = qn[0]
    block["days_since_use"][crowd] = torch.linspace(0, 3, len(crowd))
    block["source_id"][crowd] = 424242
    block["tenant"][crowd] = 0
    block["valid"][crowd] = True
    block["expires_at"][crowd] = math.inf
    stats: dict = {}
    _compare(block, 4, ScoreParams(), SMALL, stats=stats)
    assert stats["launches"] > 1 and stats["final_c"] > 8, stats
    got = triton_fused_topk(**block, k=4, config=SMALL)
    assert int(torch.isin(got.indices[0], crowd).sum()) == 1


def test_exact_ties_lower_row_first() -> None:
    block = onehot_block(seed=3, n=300, d=20, q=3, n_sources=90)
    for params in (ScoreParams(), ScoreParams(decay="none")):
        _compare(block, 25, params, SMALL, exact_ties=True)


def test_threshold_is_inclusive() -> None:
    """cos == threshold exactly (0.6 in float32 on both sides) is a candidate."""
    block = {
        "queries": torch.tensor([[2.0, 0.0]]),
        "vectors": torch.tensor([[0.6, 0.8], [0.0, 1.0], [0.5, 0.8660254]]),
        "days_since_use": torch.zeros(3),
        "tenant": torch.zeros(3, dtype=torch.int64),
        "source_id": torch.arange(3),
        "expires_at": torch.full((3,), math.inf, dtype=torch.float64),
        "query_tenant": torch.ones(1, dtype=torch.int64),
        "now": 0.0,
    }
    for fn in (reference_fused_topk, triton_fused_topk):
        res = fn(**block, k=2, params=ScoreParams(threshold=0.6))
        assert res.indices.tolist() == [[0, -1]], fn.__name__


def test_nan_rows_are_never_candidates() -> None:
    block = make_block(seed=8, n=120, d=16, q=2)
    block["vectors"][5] = float("nan")
    block["days_since_use"][7] = float("nan")
    _compare(block, 10, ScoreParams(), SMALL)
    got = triton_fused_topk(**block, k=10, config=SMALL)
    assert not torch.isin(got.indices, torch.tensor([5, 7])).any()


def test_backend_triton_through_the_public_api() -> None:
    block = make_block(seed=12, n=80, d=24, q=2)
    got = fused_topk(**block, k=6, backend="triton")
    ref = fused_topk(**block, k=6, backend="torch")
    assert_topk_equal(got.scores, got.indices, ref.scores, ref.indices, atol=ATOL, rtol=RTOL)
    auto = fused_topk(**block, k=6)  # CPU tensors: auto picks the torch path
    assert torch.equal(auto.indices, ref.indices)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"block_q": 8}, "block_q"),
        ({"block_n": 100}, "block_n must be a power of two"),
        ({"block_q": 256, "block_n": 512}, "<= 65536"),
        ({"block_m": 32}, "block_m"),
    ],
)
def test_block_config_validation(kwargs: dict, message: str) -> None:
    with pytest.raises(ValidationError, match=message):
        BlockConfig(**kwargs)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_storage_is_the_fp32_answer_for_the_rounded_vectors(dtype: torch.dtype) -> None:
    # fp32 accumulation: a half-stored block must give what float32 gives for the same
    # (rounded) vectors, in both backends, not merely something close to it.
    block = make_block(seed=21, n=400, d=72, q=5)
    half = dict(block, vectors=block["vectors"].to(dtype))
    rounded = dict(block, vectors=half["vectors"].float())
    want = reference_fused_topk(**rounded, k=9)
    for got in (reference_fused_topk(**half, k=9), triton_fused_topk(**half, k=9, config=SMALL)):
        assert_topk_equal(got.scores, got.indices, want.scores, want.indices, atol=ATOL, rtol=RTOL)
        assert_close(got.similarity, want.similarity, atol=ATOL, rtol=RTOL, name="similarity")


def test_many_row_blocks_on_one_grid_axis() -> None:
    # 2 query blocks x 94 row blocks of 16 rows: every (query block, row block) pair decoded from
    # the single program id must land on its own tile.
    cfg = BlockConfig(block_q=16, block_n=16, block_d=16)
    _compare(make_block(seed=8, n=1500, d=20, q=20), 6, ScoreParams(), cfg)


def test_grid_has_no_65535_row_block_limit() -> None:
    from recallserve.kernels.fused_score import MAX_GRID_X, launch_programs

    cfg = BlockConfig(block_q=16, block_n=128)
    # 10M rows: 78,125 row blocks, more than CUDA allows on grid axis 1 or 2 (65,535).
    assert launch_programs(64, 10_000_000, cfg) == 4 * 78_125
    with pytest.raises(ValueError, match="grid limit"):
        launch_programs(2**20, 2**31 - 1, BlockConfig(block_q=16, block_n=16))
    assert MAX_GRID_X == 2**31 - 1


def test_backend_triton_on_cpu_tensors_without_the_interpreter_is_a_clear_error() -> None:
    # The interpreter mode is fixed per process, so this runs in a fresh one without TRITON_INTERPRET.
    import os
    import subprocess
    import sys

    code = (
        "from tests.kernels._data import make_block\n"
        "from kernels import fused_topk\n"
        "try:\n"
        "    fused_topk(**make_block(seed=1, n=40, d=16, q=2), k=3, backend='triton')\n"
        "except ValueError as exc:\n"
        "    print('ValueError:', exc)\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120,
                         cwd=os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))
    assert "ValueError: backend 'triton' needs CUDA tensors (got cpu)" in out.stdout, out.stderr[-2000:]
