"""The GPU check's steps (run by ``scripts/gpu_check.sh``; one step per call, JSON rows out).

Steps:
  imports  -- the modules the check uses import without faiss, ray or vllm (blocked here).
  pytest   -- ``tests/gpu`` (compiled Triton vs the torch reference), in process.
  kernels  -- ``recallserve.kernels.bench.bench_kernels``: torch vs Triton, GB/s and share of HBM peak.
  memory   -- ``recallserve.memory_shards.bench.run_memory_bench`` (``recallserve bench memory``) with device-resident columns.
  shard    -- a device-resident ``MemoryShard`` (fp32 and fp16) against the torch reference on CPU.

``--cpu`` runs every step on the CPU with small sizes (the dry run: same code, no GPU figures).
Every step blocks ``faiss``, ``ray`` and ``vllm`` imports, as on the bare GPU machine.
"""

from __future__ import annotations

import argparse
import importlib.abc
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.append(str(ROOT))  # for `tests`; behind site-packages, where it shadows nothing

#: Not on the GPU machine; the check must not need them (the FAISS baselines are skipped).
ABSENT = ("faiss", "ray", "vllm")


class _Block(importlib.abc.MetaPathFinder):
    """Makes ``import faiss`` (ray, vllm) fail as it does on a machine without them."""

    def find_spec(self, fullname, path=None, target=None):  # noqa: ANN001 - importlib protocol
        if fullname.split(".")[0] in ABSENT:
            raise ModuleNotFoundError(f"No module named {fullname!r} (blocked: absent on the GPU machine)")
        return None


def _write(out: Path, name: str, rows: object) -> None:
    out.mkdir(parents=True, exist_ok=True)
    (out / f"{name}.json").write_text(json.dumps(rows, indent=1, default=str), encoding="utf-8")


def step_imports(cpu: bool, out: Path) -> int:
    mods = ["recallserve.kernels", "recallserve.kernels.bench", "recallserve.kernels.reference", "recallserve.memory_shards.shard", "recallserve.memory_shards.bench.memory",
            "recallserve.memory_shards._ivf", "recallserve.memory_shards.config"]
    import torch

    if not cpu or torch.cuda.is_available():
        mods.append("recallserve.kernels.fused_score")
    import importlib

    for m in mods:
        importlib.import_module(m)
    leaked = sorted(m for m in sys.modules if m.split(".")[0] in ABSENT)
    own = {"recallserve", "__main__"}
    third = sorted({m.split(".")[0] for m in sys.modules} - set(sys.stdlib_module_names) - own)
    print(f"imports ok: {', '.join(mods)}; absent modules imported: {leaked or 'none'}")
    print(f"third-party packages loaded: {', '.join(r for r in third if not r.startswith('_'))}")
    return 0 if not leaked else 1


def step_pytest(cpu: bool, out: Path) -> int:
    import pytest

    args = ["tests/gpu", "-q", "-p", "no:cacheprovider", f"--junitxml={out / 'pytest-gpu.xml'}"]
    code = pytest.main(args)
    # NOTE: without CUDA tests/gpu skips as a whole: pytest's "no tests ran" (5) is the expected dry-run answer.
    return 0 if code == 0 or (cpu and code == 5) else int(code)


def step_kernels(cpu: bool, out: Path) -> int:
    from recallserve.kernels.bench import bench_kernels

    # NOTE: the GPU target: the fused scan at 1M x 384 fp16, 64 queries, >= 70% of HBM bandwidth.
    shapes = [(20_000, 384, 64, 20, "float32"), (20_000, 384, 64, 20, "float16")] if cpu else [
        (200_000, 384, 64, 20, "float32"), (1_000_000, 384, 64, 20, "float32"), (1_000_000, 384, 64, 20, "float16"),
        (1_000_000, 384, 64, 20, "bfloat16"), (1_000_000, 384, 1, 20, "float16")]
    rows = []
    for n, d, q, k, dtype in shapes:
        for row in bench_kernels(n, d, q, k, repeats=3 if cpu else 20, dtype=dtype):
            rows.append(row)
            share = row.get("fraction_of_peak")
            print(f"{row['impl']:12s} {dtype:8s} n={n:>9,} q={q:>3} {row['ms_median']:9.3f} ms  {row['gbps']:8.1f} GB/s"
                  + (f"  {share:.1%} of {row['peak_gbps']:.0f} GB/s (copy {row['copy_gbps']} GB/s)" if share else "")
                  + (f"  {row['speedup_vs_torch']}x torch" if "speedup_vs_torch" in row else ""))
    _write(out, "kernels", rows)
    return 0


def step_memory(cpu: bool, out: Path) -> int:
    from recallserve.memory_shards.bench import run_memory_bench

    sizes, repeats = ([5_000], 1) if cpu else ([200_000, 1_000_000], 5)
    rows = []
    for dtype in ("float32", "float16"):
        rows += run_memory_bench(sizes, 384, 64, 20, repeats, 0, "auto", device="cpu" if cpu else "cuda",
                                 vector_dtype=dtype)
    for r in rows:
        bw = f"  {r['gbps']:.0f} GB/s ({r['fraction_of_peak'] or 0:.0%})" if "gbps" in r else ""
        print(f"{r['size']:>9,} {r['method']:24s} {r['device']:5s} {r['vector_dtype']:8s} {r['ms_per_batch']:9.2f} ms"
              f"  recall {r['recall']:.4f}{bw}")
    _write(out, "memory", rows)
    # NOTE: fp32 fused / unfused rows are exact up to float32 near-ties; fp16 rows are reported, not judged.
    exact = [r for r in rows if r["method"] in ("fused", "unfused-torch") and r["vector_dtype"] == "float32"]
    return 0 if all(r["recall"] >= 0.99 for r in exact) else 1


def step_shard(cpu: bool, out: Path) -> int:
    """Same records in a CPU fp32 shard (torch reference) and a device shard (fp32, fp16): same answers."""
    import numpy as np
    import torch

    from recallserve.kernels import ScoreParams
    from recallserve.memory_shards import EmbeddedRecord, MemoryRecord, MemoryShard, ShardConfig

    device = "cpu" if cpu else "cuda"
    n, dim, nq, k = (1_500, 384, 16, 10) if cpu else (50_000, 384, 64, 20)
    rng = np.random.default_rng(7)
    now = 1.7e9
    centres = rng.standard_normal((64, dim)).astype(np.float32)
    items = []
    for i in range(n):
        v = centres[i % 64] + rng.standard_normal(dim).astype(np.float32) * 0.8
        rec = MemoryRecord(tenant=("t1", "t2", "shared")[i % 3], source_id=f"s{i // 2}", text=f"m{i}",
                           created_at=now - 1e6, last_access_at=now - float(rng.uniform(0, 90)) * 86_400)
        items.append(EmbeddedRecord(rec, (v / np.linalg.norm(v))[None, :]))
    q = centres[rng.integers(0, 64, nq)] + rng.standard_normal((nq, dim)).astype(np.float32) * 0.8
    q = (q / np.linalg.norm(q, axis=1, keepdims=True)).astype(np.float32)
    tenants = [("t1", "t2")[i % 2] for i in range(nq)]
    params = ScoreParams(threshold=0.3)

    def build(**kw) -> MemoryShard:
        shard = MemoryShard(ShardConfig(model_id="check", dim=dim, exact_max_rows=10**9, **kw))
        shard.upsert(items)
        return shard

    def answer(shard: MemoryShard):
        t0 = time.perf_counter()
        hits = shard.search(q, tenants, k=k, params=params, now=now, touch=False)
        ms = (time.perf_counter() - t0) * 1e3
        return [[(h.record.id, h.score) for h in hs] for hs in hits], ms

    ref_shard = build(device="cpu", backend="torch")
    want, _ = answer(ref_shard)
    rows, failed = [], 0
    for dtype in ("float32", "float16"):
        shard = build(device=device, vector_dtype=dtype)
        answer(shard)  # NOTE: first search copies the rows to the device and compiles the kernel.
        got, ms = answer(shard)
        st = shard.stats()
        same_ids = sum(g[0] == w[0] for gs, ws in zip(got, want) for g, w in zip(gs, ws))
        total = sum(len(ws) for ws in want)
        recall = float(np.mean([len({g[0] for g in gs} & {w[0] for w in ws}) / max(len(ws), 1)
                                for gs, ws in zip(got, want)]))
        err = max((abs(g[1] - w[1]) for gs, ws in zip(got, want) for g, w in zip(gs, ws)), default=0.0)
        row = {"device": st["device"], "kernel": st["kernel"], "vector_dtype": dtype, "rows": n, "queries": nq, "k": k,
               "ms_search": round(ms, 2), "same_rank_share": round(same_ids / max(total, 1), 4), "recall": round(recall, 4),
               "max_score_diff": err, "device_bytes": st["device_bytes"], "hits": total}
        # fp32: the same answer as the reference (scores to a few ulp); fp16: rounding of the stored vectors only.
        ok = (recall == 1.0 and err < 1e-5) if dtype == "float32" else (recall >= 0.95 and err < 2e-3)
        if not cpu and st["kernel"] != "triton":
            ok = False
        row["ok"] = ok
        failed += not ok
        rows.append(row)
        print(json.dumps(row))
    _write(out, "shard", rows)
    return 1 if failed else 0


STEPS = {"imports": step_imports, "pytest": step_pytest, "kernels": step_kernels, "memory": step_memory,
         "shard": step_shard}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("step", choices=sorted(STEPS))
    p.add_argument("--cpu", action="store_true", help="dry run on the CPU with small sizes")
    p.add_argument("--out", type=Path, required=True, help="folder for the JSON rows")
    args = p.parse_args(argv)
    sys.meta_path.insert(0, _Block())
    import torch

    if not args.cpu and not torch.cuda.is_available():
        print("gpu_check: torch sees no CUDA device (use --cpu for the dry run)", file=sys.stderr)
        return 3
    return STEPS[args.step](args.cpu, args.out)


if __name__ == "__main__":
    sys.exit(main())
