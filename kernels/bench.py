"""Micro-benchmark of the fused scoring backends: torch reference vs compiled Triton (CUDA).

Rows are plain dicts (JSON/CSV-ready) with device, versions and a UTC timestamp, so a run is data
(STYLE habit 13). On CUDA each Triton row reports achieved GB/s for the scan against the HBM
bound: bytes read = N*D*4 (vectors) + N*21 (days f32, tenant i64, expires f64, valid u8) + Q*D*4.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable
from datetime import datetime, timezone

import torch

from recallserve.kernels._dispatch import triton_available
from recallserve.kernels._params import ScoreParams
from recallserve.kernels.reference import reference_fused_topk

__all__ = ["bench_kernels", "scan_bytes", "PEAK_HBM_GBPS"]

# NOTE: vendor datasheet peak memory bandwidth (GB/s), matched by substring of the device name;
# the achievable figure is ~85-92% of these. Unknown devices get the measured copy bandwidth only.
PEAK_HBM_GBPS = {
    "H200": 4800.0,
    "H100 SXM": 3350.0,
    "H100 PCIe": 2000.0,
    "H100": 3350.0,
    "A100-SXM4-80GB": 2039.0,
    "A100": 1555.0,
    "L40S": 864.0,
    "A10G": 600.0,
    "L4": 300.0,
    "T4": 320.0,
}
# NOTE: metadata bytes per row read by the kernel: days f32 + tenant i64 + expires f64 + valid u8.
_META_BYTES_PER_ROW = 4 + 8 + 8 + 1
_DTYPES = {"float32": torch.float32, "float16": torch.float16, "bfloat16": torch.bfloat16}


def scan_bytes(n: int, d: int, q: int, vector_bytes: int = 4) -> int:
    """Bytes one fused pass must read: vectors (``vector_bytes`` per element: 4 fp32, 2 fp16/bf16),
    per-row metadata and the float32 queries."""
    return n * d * vector_bytes + n * _META_BYTES_PER_ROW + q * d * 4


def _peak_for(name: str) -> float | None:
    for key, value in PEAK_HBM_GBPS.items():
        if key in name:
            return value
    return None


def _time(fn: Callable[[], object], repeats: int, cuda: bool) -> list[float]:
    fn()  # NOTE: warm-up run: compilation / allocator growth stay out of the timings.
    out = []
    for _ in range(repeats):
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn()
        if cuda:
            torch.cuda.synchronize()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def _make_inputs(n: int, d: int, q: int, device: str, seed: int) -> dict:
    g = torch.Generator(device="cpu").manual_seed(seed)
    v = torch.randn(n, d, generator=g)
    v = v / v.norm(dim=1, keepdim=True)
    # NOTE: queries near stored rows so a realistic share of rows passes the 0.35 threshold.
    near = v[torch.randint(0, max(n, 1), (q,), generator=g)]
    qv = near + 0.5 * torch.randn(q, d, generator=g) / d**0.5
    now = 1.7e9
    return {
        "queries": qv.to(device),
        "vectors": v.to(device),
        "days_since_use": (torch.rand(n, generator=g) * 100).to(device),
        "tenant": torch.randint(0, 4, (n,), generator=g).to(device),
        "source_id": torch.randint(0, max(1, n // 4), (n,), generator=g).to(device),
        "expires_at": torch.full((n,), float("inf"), dtype=torch.float64).to(device),
        "query_tenant": torch.randint(1, 4, (q,), generator=g).to(device),
        "now": now,
        "valid": torch.ones(n, dtype=torch.bool).to(device),
    }


def _measured_copy_gbps(x: torch.Tensor, repeats: int) -> float:
    """Read+write bandwidth of a device copy of ``x`` (a practical roofline)."""
    y = torch.empty_like(x)
    ms = statistics.median(_time(lambda: y.copy_(x), repeats, True))
    return 2 * x.numel() * x.element_size() / (ms * 1e-3) / 1e9


def bench_kernels(
    n: int, d: int, q: int, k: int, repeats: int = 10, *, seed: int = 0,
    params: ScoreParams | None = None, threads: int | None = None, dtype: str = "float32",
) -> list[dict]:
    """Time every available backend on one random block; one dict per implementation.

    Args:
        n, d, q, k: rows, dimension, queries, results per query.
        repeats: timed runs after one warm-up (median and min reported).
        threads: torch CPU threads for the run (restored after). NOTE: on a shared 2-core
            machine 1 thread is ~10x faster than 2 under load (OpenMP barriers spin).
        dtype: storage of the vectors (float32, float16, bfloat16); queries stay float32.

    Returns:
        Rows with ``impl``, ``device``, shape, ``ms_median``, ``ms_min``, ``gbps`` (scan bytes /
        median time), and on CUDA ``peak_gbps`` (datasheet), ``copy_gbps`` (measured), and
        ``fraction_of_peak``; ``speedup_vs_torch`` on the Triton row.

    Example:
        >>> for row in bench_kernels(200_000, 384, 64, 20, repeats=5): print(row)
    """
    if min(n, d, q, k, repeats) < 1:
        raise ValueError("n, d, q, k and repeats must all be >= 1")
    if dtype not in _DTYPES:
        raise ValueError(f"dtype: must be one of {sorted(_DTYPES)}, got {dtype!r}")
    params = params or ScoreParams()
    old_threads = torch.get_num_threads()
    if threads is not None:
        torch.set_num_threads(threads)
    try:
        return _bench(n, d, q, k, repeats, seed, params, _DTYPES[dtype])
    finally:
        torch.set_num_threads(old_threads)


def _bench(
    n: int, d: int, q: int, k: int, repeats: int, seed: int, params: ScoreParams, dtype: torch.dtype
) -> list[dict]:
    cuda = torch.cuda.is_available()
    device = "cuda" if cuda else "cpu"
    dev_name = torch.cuda.get_device_name() if cuda else "cpu"
    inputs = _make_inputs(n, d, q, device, seed)
    inputs["vectors"] = inputs["vectors"].to(dtype)
    nbytes = scan_bytes(n, d, q, vector_bytes=inputs["vectors"].element_size())
    base = {
        "device": dev_name, "n": n, "d": d, "q": q, "k": k, "repeats": repeats,
        "dtype": str(dtype).removeprefix("torch."),
        "bytes_scanned": nbytes, "torch_version": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "timestamp": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    }
    impls: list[tuple[str, Callable[[], object]]] = [
        (f"torch-{device}", lambda: reference_fused_topk(**inputs, k=k, params=params))
    ]
    if cuda and triton_available():
        from recallserve.kernels.fused_score import triton_fused_topk

        impls.append(("triton-cuda", lambda: triton_fused_topk(**inputs, k=k, params=params)))
    rows = []
    for impl, fn in impls:
        ms = _time(fn, repeats, cuda)
        med = statistics.median(ms)
        row = dict(base, impl=impl, ms_median=round(med, 4), ms_min=round(min(ms), 4),
                   gbps=round(nbytes / (med * 1e-3) / 1e9, 2))
        if cuda:
            peak = _peak_for(dev_name)
            row["peak_gbps"] = peak
            row["copy_gbps"] = round(_measured_copy_gbps(inputs["vectors"], repeats), 1)
            row["fraction_of_peak"] = round(row["gbps"] / peak, 3) if peak else None
        rows.append(row)
    if len(rows) == 2:
        rows[1]["speedup_vs_torch"] = round(rows[0]["ms_median"] / rows[1]["ms_median"], 2)
        import triton

        rows[1]["triton_version"] = triton.__version__
    return rows
