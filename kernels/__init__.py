"""Fused memory scoring kernels: cosine x time decay, tenant/expiry/threshold masks, dedup by
source id and top-k, as a Triton kernel (GPU) with a pure-torch reference (CPU path and oracle).
Also the project's shared bases, which live at the bottom layer: the pydantic base model
(:class:`StrictModel`) and :func:`lazy_exports`.

Importing this package never imports triton; ``fused_topk(..., backend="triton")`` does.
"""

from recallserve.kernels._base import (
    CONTROL_CHARS,
    NoControl,
    StrictModel,
    check_json,
    checkout_root_after_site_packages,
    lazy_exports,
    no_control,
)

# NOTE: first thing in every process that imports the project (kernels is the bottom layer):
# the checkout's root on sys.path would shadow Hugging Face's `kernels` with this folder.
checkout_root_after_site_packages()

__all__ = [
    "CONTROL_CHARS",
    "NoControl",
    "SHARED_TENANT",
    "ScoreParams",
    "StrictModel",
    "check_json",
    "checkout_root_after_site_packages",
    "TopKResult",
    "fused_topk",
    "lazy_exports",
    "no_control",
    "reference_fused_topk",
    "triton_available",
]

# NOTE: the kernel names load on first use so that ``from kernels import StrictModel`` (API
# schemas, configs, the CLI's --help) does not import torch.
_LAZY = {
    "SHARED_TENANT": "recallserve.kernels._params",
    "ScoreParams": "recallserve.kernels._params",
    "TopKResult": "recallserve.kernels._params",
    "fused_topk": "recallserve.kernels._dispatch",
    "triton_available": "recallserve.kernels._dispatch",
    "reference_fused_topk": "recallserve.kernels.reference",
}

__getattr__ = lazy_exports(__name__, _LAZY)
