"""Triton fused memory scoring: cosine x time decay, masks, per-block top candidates.

One pass over the stored vectors computes, per (query block, row block) tile:

    c = <q / |q|, v_n>                                    (fp32, IEEE dot, D looped)
    f = 1 / (1 + lambda * days) | 0.5 ** (days / half_life) | 1,   days = max(days_since_use, 0)
    s = c * f  (product)   |   w * c + (1 - w) * f  (weighted)
    candidate iff valid[n] & (tenant[n] == query_tenant[q] | tenant[n] == 0)
                & expires_at[n] > now (float64) & c >= threshold & s is not NaN

and keeps the ``C`` best candidates of the tile per query (C rounds of row-max selection, or the
whole tile when ``C == BLOCK_N``) as packed int64 keys
``(order32(s) << 32) | (0xFFFFFFFF - n)`` (see ``recallserve.kernels._select``), so ties on equal float32 score
go to the lower row index, in the kernel as on the host. The host then ranks the ``[Q, blocks * C]``
keys (``topk`` on a growing prefix), keeps the first row of each ``source_id`` and the first
``k`` of those (``recallserve.kernels._select.select_topk``).

Exactness: the answer is the first ``k`` distinct-source rows in key order over all candidates.
A row missing from the per-block lists ranks below its block's ``C``-th key, and only blocks whose
``C``-th entry is a live candidate ("full" blocks) can miss rows. So the host result is exact iff,
for every full block, its ``C``-th key ranks below the ``k``-th answer row (with fewer than ``k``
answers: iff no block is full). Queries failing that check (one source's duplicates crowding a
block) are rerun with ``C`` x4, up to ``C = BLOCK_N`` where nothing can be missed.

Sources: Liger-Kernel ``ops/`` layout (kernel, launcher, public function); FAISS-style exact
top-k with draws (``check_ref_knn_with_draws``); order-preserving float->int key packing as in
radix-select top-k.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from pydantic import Field, ValidationInfo, field_validator, model_validator
from triton.runtime.interpreter import InterpretedFunction

from recallserve.kernels._params import SHARED_TENANT, ScoreParams, TopKResult, check_inputs
from recallserve.kernels._select import pack_keys, select_topk, time_factor, unpack_keys
from recallserve.kernels.reference import empty_result, finish_result, normalize_queries
from recallserve.kernels._base import StrictModel

__all__ = ["triton_fused_topk", "BlockConfig", "launch_programs", "MAX_GRID_X"]

_DECAY_CODE = {"none": 0, "hyperbolic": 1, "exponential": 2}
# NOTE: smallest int64 key; "no k-th answer" compares below every live block key.
_MIN_KEY = -(2**63)


@triton.jit
def _fused_score_topc(
    q_ptr, v_ptr, days_ptr, tenant_ptr, expires_ptr, valid_ptr, qtenant_ptr, now_ptr, out_ptr,
    Q, N, D, stride_q, stride_v, stride_out, q_blocks,
    threshold, decay_lambda, half_life, weight,
    DECAY: tl.constexpr, WEIGHTED: tl.constexpr, SHARED: tl.constexpr,
    BLOCK_Q: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr, C: tl.constexpr,
):
    # NOTE: one grid axis: program = row_block * q_blocks + query_block. CUDA caps grid axes 1
    # and 2 at 65,535 blocks, which a second axis of row blocks passed at 65,536 * BLOCK_N rows
    # (8.4M at 128); axis 0 goes to 2**31 - 1. Query blocks vary fastest, so programs running
    # together read the same row block (L2 reuse when Q > BLOCK_Q).
    pid = tl.program_id(0)
    pid_q = pid % q_blocks
    pid_n = pid // q_blocks
    offs_q = pid_q * BLOCK_Q + tl.arange(0, BLOCK_Q)
    offs_n = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    offs_d = tl.arange(0, BLOCK_D)
    q_ok = offs_q < Q
    n_ok = offs_n < N
    # NOTE: int64 row offsets: N * D can pass 2**31 elements in one block of vectors.
    q_rows = q_ptr + offs_q.to(tl.int64)[:, None] * stride_q
    v_rows = v_ptr + offs_n.to(tl.int64)[:, None] * stride_v
    acc = tl.zeros((BLOCK_Q, BLOCK_N), dtype=tl.float32)
    for d0 in range(0, D, BLOCK_D):
        d = d0 + offs_d
        d_ok = d < D
        qt = tl.load(q_rows + d[None, :], mask=q_ok[:, None] & d_ok[None, :], other=0.0)
        # NOTE: fp16/bf16 storage is widened here; products and sums stay fp32 (see STORAGE_DTYPES).
        vt = tl.load(v_rows + d[None, :], mask=n_ok[:, None] & d_ok[None, :], other=0.0)
        vt = vt.to(tl.float32)
        # NOTE: IEEE fp32 (not TF32): TF32's 10-bit mantissa would move cosines near the
        # threshold and reorder near-ties relative to the torch reference.
        acc = tl.dot(qt, tl.trans(vt), acc, input_precision="ieee")
    cos = acc

    days = tl.maximum(tl.load(days_ptr + offs_n, mask=n_ok, other=0.0), 0.0)
    if DECAY == 1:
        f = 1.0 / (1.0 + decay_lambda * days)
    elif DECAY == 2:
        f = tl.exp2(-days / half_life)
    else:
        f = tl.full((BLOCK_N,), 1.0, tl.float32)
    if WEIGHTED:
        s = weight * cos + (1.0 - weight) * f[None, :]
    else:
        s = cos * f[None, :]

    tenant = tl.load(tenant_ptr + offs_n, mask=n_ok, other=-1)
    qtenant = tl.load(qtenant_ptr + offs_q, mask=q_ok, other=-1)
    expires = tl.load(expires_ptr + offs_n, mask=n_ok, other=0.0)
    now = tl.load(now_ptr)  # NOTE: float64 through memory; a float scalar arg would be fp32.
    valid = tl.load(valid_ptr + offs_n, mask=n_ok, other=0)
    row_ok = n_ok & (valid != 0) & (expires > now)
    visible = (tenant[None, :] == qtenant[:, None]) | (tenant[None, :] == SHARED)
    ok = row_ok[None, :] & visible & (cos >= threshold) & (s == s) & q_ok[:, None]
    s = tl.where(ok, s, float("-inf"))

    bits = s.to(tl.int32, bitcast=True)
    ordered = bits ^ ((bits >> 31) & 0x7FFFFFFF)
    low32 = (tl.full((), 1, tl.int64) << 32) - 1
    key = (ordered.to(tl.int64) << 32) | (~offs_n.to(tl.int64) & low32)
    out = out_ptr + offs_q.to(tl.int64) * stride_out + pid_n * C
    if C == BLOCK_N:
        # The whole tile is the candidate list: nothing can be left out (exact by construction).
        tl.store(out[:, None] + tl.arange(0, BLOCK_N)[None, :], key, mask=q_ok[:, None])
    else:
        # NOTE: C rounds of "row max, then retire it" instead of tl.topk: keys are unique (the
        # row index is in the low bits), so each round retires exactly one entry per query.
        # In the interpreter this is ~50x faster than tl.topk's bitonic network (measured:
        # [32, 256] -> 32 in 0.08 s vs 10.5 s); on the GPU it is C warp reductions per tile.
        for c in range(C):
            best = tl.max(key, axis=1)
            tl.store(out + c, best, mask=q_ok)
            key = tl.where(key == best[:, None], -9223372036854775807 - 1, key)


def _interpreting() -> bool:
    """True when triton runs kernels in its interpreter (TRITON_INTERPRET=1 at import)."""
    # NOTE: the mode is fixed per process when triton is first imported: `@triton.jit` picks
    # JITFunction or InterpretedFunction at decoration, and triton's own library functions
    # (tl.topk, tl.sort, tl.max in triton/language/standard.py) are decorated at that import.
    # An InterpretedFunction built by hand later fails inside tl.topk with "Cannot call
    # @triton.jit'd outside of the scope of a kernel" (measured with triton 3.7.1).
    return isinstance(_fused_score_topc, InterpretedFunction)


class BlockConfig(StrictModel):
    """Tile sizes of one kernel program (powers of two; ``tl.dot`` needs >= 16)."""

    block_q: int = Field(default=16, ge=16, le=256, description="Queries per program.")
    block_n: int = Field(default=128, ge=16, le=4096, description="Stored rows per program.")
    block_d: int = Field(default=64, ge=16, le=1024, description="Columns per dot-product step.")
    num_warps: int = Field(default=4, ge=1, le=32, description="Warps per program (GPU only).")

    @field_validator("block_q", "block_n", "block_d", "num_warps")
    @classmethod
    def _power_of_two(cls, value: int, info: ValidationInfo) -> int:
        if value & (value - 1):
            raise ValueError(f"{info.field_name} must be a power of two, got {value}")
        return value

    @model_validator(mode="after")
    def _tile_fits(self) -> BlockConfig:
        # NOTE: the interpreter fails on blocks over 2**20 elements; the compiled kernel holds
        # the [block_q, block_n] int64 keys in registers.
        if self.block_q * self.block_n > 2**16:
            raise ValueError(
                f"block_q * block_n must be <= 65536, got {self.block_q * self.block_n}"
            )
        return self


def _default_config(device: torch.device, q: int) -> BlockConfig:
    if device.type == "cpu":
        # NOTE: the interpreter's cost is per program and per op, so wide tiles run fastest.
        return BlockConfig(block_q=16 if q <= 16 else 32, block_n=256, block_d=128)
    # NOTE: untuned starting point for the GPU (no device measured yet): the scan is
    # memory-bound for small Q, and 16 x 128 int64 keys per program keep the C max-rounds cheap.
    return BlockConfig(block_q=16 if q <= 16 else 32, block_n=128, block_d=64, num_warps=4)


#: CUDA's limit on grid axis 0 (axes 1 and 2 stop at 65,535).
MAX_GRID_X = 2**31 - 1


def launch_programs(q: int, n: int, cfg: BlockConfig) -> int:
    """Programs of one launch: ``cdiv(Q, block_q) * cdiv(N, block_n)``, all on grid axis 0.

    Raises:
        ValueError: when that passes CUDA's axis-0 limit (not reachable below 2**31 rows).
    """
    programs = triton.cdiv(q, cfg.block_q) * triton.cdiv(n, cfg.block_n)
    if programs > MAX_GRID_X:
        raise ValueError(f"{programs} programs exceed the grid limit {MAX_GRID_X}; split the block")
    return programs


def _launch(
    qn: torch.Tensor,
    vectors: torch.Tensor,
    days: torch.Tensor,
    tenant: torch.Tensor,
    expires_at: torch.Tensor,
    valid_u8: torch.Tensor,
    query_tenant: torch.Tensor,
    now_t: torch.Tensor,
    params: ScoreParams,
    cfg: BlockConfig,
    c: int,
) -> torch.Tensor:
    """Run the kernel; return ``[Q, n_blocks * c]`` int64 keys, each block's ``c`` sorted desc
    (unsorted when ``c == block_n``)."""
    q, d = qn.shape
    n = vectors.shape[0]
    n_blocks = triton.cdiv(n, cfg.block_n)
    out = torch.empty((q, n_blocks * c), dtype=torch.int64, device=vectors.device)
    q_blocks = triton.cdiv(q, cfg.block_q)
    grid = (launch_programs(q, n, cfg),)
    _fused_score_topc[grid](
        qn, vectors, days, tenant, expires_at, valid_u8, query_tenant, now_t, out,
        q, n, d, qn.stride(0), vectors.stride(0), out.stride(0), q_blocks,
        float(params.threshold), float(params.decay_lambda), float(params.half_life_days),
        float(params.similarity_weight),
        DECAY=_DECAY_CODE[params.decay], WEIGHTED=params.combine == "weighted",
        SHARED=SHARED_TENANT,
        BLOCK_Q=cfg.block_q, BLOCK_N=cfg.block_n, BLOCK_D=cfg.block_d, C=c,
        num_warps=cfg.num_warps,
    )
    return out


def _complete(
    keys: torch.Tensor, c: int, block_n: int, s: torch.Tensor, r: torch.Tensor
) -> torch.Tensor:
    """Per query: True when no row left out of the per-block lists could change the answer."""
    if c >= block_n:
        return torch.ones(keys.shape[0], dtype=torch.bool, device=keys.device)
    last = keys.view(keys.shape[0], -1, c)[:, :, -1]  # [Q, blocks]: each block's c-th key
    full = torch.isfinite(unpack_keys(last)[0])
    found_k = r[:, -1] >= 0
    kth = torch.where(
        found_k, pack_keys(s[:, -1].contiguous(), r[:, -1]), torch.full_like(r[:, -1], _MIN_KEY)
    )
    return ~(full & (last > kth.unsqueeze(1))).any(dim=1)


def triton_fused_topk(
    queries: torch.Tensor,
    vectors: torch.Tensor,
    days_since_use: torch.Tensor,
    tenant: torch.Tensor,
    source_id: torch.Tensor,
    expires_at: torch.Tensor,
    query_tenant: torch.Tensor,
    now: float,
    k: int,
    params: ScoreParams | None = None,
    valid: torch.Tensor | None = None,
    config: BlockConfig | None = None,
    stats: dict | None = None,
) -> TopKResult:
    """Fused score + masks + per-block top-C in Triton, dedup and exact top-k on the host.

    Same arguments, semantics and result as ``recallserve.kernels.reference_fused_topk`` (see the module
    docstring for the formula, the masks, the tie rule and why the result is exact). CUDA tensors
    run the compiled kernel; CPU tensors need the Triton interpreter (``TRITON_INTERPRET=1`` set
    before triton is imported; tests only: ~100x slower than the torch path). ``similarity`` is
    recomputed on the host for the k chosen rows.
    ``config`` overrides the tile sizes; a ``stats`` dict, when given, receives ``launches``
    (kernel runs, > 1 when a block had to be widened) and ``final_c`` (slots per block).

    Example:
        >>> res = triton_fused_topk(q.cuda(), v.cuda(), ..., now=time.time(), k=15)
    """
    params = ScoreParams() if params is None else params
    x = check_inputs(
        queries, vectors, days_since_use, tenant, source_id, expires_at, query_tenant,
        now, k, params, valid,
    )
    q, n = x.queries.shape[0], x.vectors.shape[0]
    device = x.vectors.device
    if q == 0 or n == 0:
        return empty_result(q, k, device)
    if device.type != "cuda" and not _interpreting():
        raise ValueError(
            f"backend 'triton' needs CUDA tensors (got {device}); on CPU it runs only in the "
            "Triton interpreter: set TRITON_INTERPRET=1 before triton is first imported"
        )
    cfg = config or _default_config(device, q)
    qn = normalize_queries(x.queries).contiguous()
    vectors_c = x.vectors.contiguous()
    days = x.days_since_use.contiguous()
    now_t = torch.tensor([float(now)], dtype=torch.float64, device=device)
    valid_u8 = x.valid.contiguous().view(torch.uint8)
    out_s = torch.empty((q, k), dtype=torch.float32, device=device)
    out_r = torch.empty((q, k), dtype=torch.int64, device=device)
    todo = torch.arange(q, device=device)
    # NOTE: 2k slots per block leave room for a few duplicates before a rerun is needed.
    c = min(cfg.block_n, triton.next_power_of_2(2 * k))
    launches = 0
    while todo.numel():
        launches += 1
        keys = _launch(
            qn[todo], vectors_c, days, x.tenant, x.expires_at, valid_u8,
            x.query_tenant[todo], now_t, params, cfg, c,
        )
        s, r = select_topk(keys, x.source_id, k)
        done = _complete(keys, c, cfg.block_n, s, r)
        out_s[todo[done]] = s[done]
        out_r[todo[done]] = r[done]
        todo = todo[~done]
        if todo.numel():
            c = min(cfg.block_n, 4 * c)
    if stats is not None:
        stats.update(launches=launches, final_c=c)
    safe = out_r.clamp_min(0)
    cos = torch.bmm(vectors_c[safe].float(), qn.unsqueeze(2)).squeeze(2)
    return finish_result(out_s, out_r, cos, time_factor(days, params)[safe])
