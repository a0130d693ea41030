"""Compiled Triton kernel on CUDA against the torch reference (on the same GPU and on the CPU).

Skipped as a whole when CUDA is unavailable; run on a lent GPU machine with
``PYTHONPATH=. python -m pytest tests/gpu -m gpu -q``.
"""

from __future__ import annotations

import math

import pytest
import torch

if not torch.cuda.is_available():
    pytest.skip("CUDA is not available", allow_module_level=True)
pytest.importorskip("triton")

from recallserve.kernels import ScoreParams, fused_topk, reference_fused_topk  # noqa: E402
from recallserve.kernels.bench import bench_kernels  # noqa: E402
from recallserve.kernels.fused_score import BlockConfig, triton_fused_topk  # noqa: E402
from tests.conftest import assert_close, assert_topk_equal  # noqa: E402
from tests.kernels._data import make_block, onehot_block  # noqa: E402

pytestmark = pytest.mark.gpu

# NOTE: IEEE fp32 dot on the GPU vs torch's cuBLAS/CPU GEMM: a few ulp of a unit cosine.
ATOL, RTOL = 5e-6, 1e-5
MODES = [
    ScoreParams(),
    ScoreParams(decay="exponential", half_life_days=7.0, combine="weighted", similarity_weight=0.6),
    ScoreParams(decay="none", threshold=0.0),
]


def _compare(block: dict, k: int, params: ScoreParams, config=None, exact_ties=False, stats=None):
    on_cpu = {name: (v.cpu() if torch.is_tensor(v) else v) for name, v in block.items()}
    ref_cpu = reference_fused_topk(**on_cpu, k=k, params=params)
    ref = reference_fused_topk(**block, k=k, params=params)
    got = triton_fused_topk(**block, k=k, params=params, config=config, stats=stats)
    for other in (ref, ref_cpu):
        assert_topk_equal(got.scores, got.indices, other.scores, other.indices, atol=ATOL,
                          rtol=RTOL, exact_ties=exact_ties)
        assert_close(got.similarity, other.similarity, atol=ATOL, rtol=RTOL, name="similarity")
        assert_close(got.time_factor, other.time_factor, atol=ATOL, rtol=RTOL, name="f")


@pytest.mark.parametrize(
    ("n", "d", "q", "k"),
    [
        (1, 16, 1, 3),
        (37, 383, 3, 5),
        (1000, 384, 5, 10),
        (5000, 769, 40, 20),
        (20_000, 384, 64, 15),
    ],
)
@pytest.mark.parametrize("mode", range(len(MODES)))
def test_cuda_matches_reference(n: int, d: int, q: int, k: int, mode: int) -> None:
    _compare(make_block(seed=n + mode, n=n, d=d, q=q, device="cuda"), k, MODES[mode])


def test_cuda_k_larger_than_candidates_and_all_masked() -> None:
    block = make_block(seed=9, n=50, d=24, q=3, n_sources=6, device="cuda")
    _compare(block, 40, ScoreParams())
    block["valid"][:] = False
    got = triton_fused_topk(**block, k=5)
    assert (got.indices == -1).all() and torch.isneginf(got.scores).all()


def test_cuda_crowding_source_is_widened() -> None:
    block = make_block(seed=4, n=2048, d=64, q=2, n_sources=500, device="cuda")
    qn = block["queries"] / block["queries"].norm(dim=1, keepdim=True)
    crowd = torch.cat([torch.arange(b * 128, b * 128 + 100) for b in range(16)]).cuda()
    block["vectors"][crowd] = qn[0]
    block["source_id"][crowd] = 424242
    block["tenant"][crowd] = 0
    block["valid"][crowd] = True
    block["expires_at"][crowd] = math.inf
    stats: dict = {}
    _compare(block, 5, ScoreParams(), BlockConfig(block_q=16, block_n=128, block_d=64), stats=stats)
    assert stats["launches"] > 1, stats


def test_cuda_exact_ties() -> None:
    _compare(onehot_block(seed=3, n=3000, d=64, q=4, n_sources=700, device="cuda"), 30,
             ScoreParams(), exact_ties=True)


def test_auto_backend_picks_triton_on_cuda() -> None:
    block = make_block(seed=1, n=500, d=64, q=4, device="cuda")
    got = fused_topk(**block, k=8)
    ref = fused_topk(**block, k=8, backend="torch")
    assert_topk_equal(got.scores, got.indices, ref.scores, ref.indices, atol=ATOL, rtol=RTOL)
    assert got.indices.is_cuda


def test_bench_rows_report_bandwidth() -> None:
    rows = bench_kernels(200_000, 384, 64, 20, repeats=5)
    impls = {r["impl"] for r in rows}
    assert {"torch-cuda", "triton-cuda"} <= impls
    triton_row = next(r for r in rows if r["impl"] == "triton-cuda")
    assert triton_row["gbps"] > 0 and triton_row["ms_median"] > 0
    print(rows)
