"""Triton kernels (interpreted on CPU) against the torch reference."""
