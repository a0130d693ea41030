"""Fused memory scoring kernels: cosine x time decay, tenant/expiry/threshold masks, dedup by
source id and top-k, as a Triton kernel (GPU) with a pure-torch reference (CPU path and oracle).

Importing this package never imports triton; ``fused_topk(..., backend="triton")`` does.
"""

from kernels._dispatch import fused_topk, triton_available
from kernels._params import SHARED_TENANT, ScoreParams, TopKResult
from kernels.reference import reference_fused_topk

__all__ = [
    "SHARED_TENANT",
    "ScoreParams",
    "TopKResult",
    "fused_topk",
    "reference_fused_topk",
    "triton_available",
]
