"""The kernel micro-benchmark returns data rows (CPU: the torch path only)."""

from __future__ import annotations

import pytest
import torch

from recallserve.kernels.bench import bench_kernels, scan_bytes

pytestmark = pytest.mark.kernels


def test_bench_rows_on_this_machine() -> None:
    rows = bench_kernels(2000, 64, 4, 5, repeats=2, threads=1)
    impls = [r["impl"] for r in rows]
    assert impls[0] == ("torch-cuda" if torch.cuda.is_available() else "torch-cpu")
    row = rows[0]
    assert row["bytes_scanned"] == scan_bytes(2000, 64, 4) == 2000 * 64 * 4 + 2000 * 21 + 4 * 64 * 4
    assert row["ms_median"] > 0 and row["ms_min"] <= row["ms_median"] and row["gbps"] > 0
    assert row["cpu_threads"] == 1 and row["timestamp"].endswith("+00:00")


def test_bench_rejects_bad_sizes() -> None:
    with pytest.raises(ValueError, match="repeats"):
        bench_kernels(10, 8, 1, 1, repeats=0)
