"""CUDA-only checks of the Triton kernels; skipped without a GPU."""
