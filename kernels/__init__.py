"""Fused memory scoring kernels: cosine x time decay, tenant/expiry/threshold masks, dedup by
source id and top-k, as a Triton kernel (GPU) with a pure-torch reference (CPU path and oracle).
Also the project's pydantic base model (:class:`StrictModel`), which lives at the bottom layer.

Importing this package never imports triton; ``fused_topk(..., backend="triton")`` does.
"""

from typing import Any

from kernels._base import StrictModel

__all__ = [
    "SHARED_TENANT",
    "ScoreParams",
    "StrictModel",
    "TopKResult",
    "fused_topk",
    "reference_fused_topk",
    "triton_available",
]

# NOTE: the kernel names load on first use so that ``from kernels import StrictModel`` (API
# schemas, configs, the CLI's --help) does not import torch.
_LAZY = {
    "SHARED_TENANT": "kernels._params",
    "ScoreParams": "kernels._params",
    "TopKResult": "kernels._params",
    "fused_topk": "kernels._dispatch",
    "triton_available": "kernels._dispatch",
    "reference_fused_topk": "kernels.reference",
}


def __getattr__(name: str) -> Any:
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'kernels' has no attribute {name!r}")
