"""The prepared GPU check: its steps run on the CPU (dry run) without faiss/ray/vllm, and on a
machine without CUDA the GPU run stops at once with a clear message."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[2]


def _step(name: str, out: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    return subprocess.run([sys.executable, "scripts/gpu_check.py", name, "--cpu", "--out", str(out)], cwd=ROOT,
                          capture_output=True, text=True, timeout=300, env=env)


def test_dry_run_steps_need_no_faiss_and_compare_shards(tmp_path: Path) -> None:
    imports = _step("imports", tmp_path)
    assert imports.returncode == 0, imports.stderr[-2000:]
    assert "absent modules imported: none" in imports.stdout
    shard = _step("shard", tmp_path)
    assert shard.returncode == 0, shard.stderr[-2000:]
    rows = json.loads((tmp_path / "shard.json").read_text())
    assert [(r["vector_dtype"], r["kernel"], r["ok"]) for r in rows] == [("float32", "torch", True), ("float16", "torch", True)]
    assert rows[0]["recall"] == 1.0 and rows[0]["max_score_diff"] < 1e-5 and rows[0]["hits"] > 0


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer on a machine without CUDA")
def test_gpu_run_without_cuda_stops_with_a_clear_message(tmp_path: Path) -> None:
    env = dict(os.environ, OUT=str(tmp_path))
    proc = subprocess.run(["bash", "scripts/gpu_check.sh"], cwd=ROOT, capture_output=True, text=True, timeout=300, env=env)
    assert proc.returncode == 3
    assert "torch sees no CUDA device" in proc.stdout + proc.stderr and "--cpu-dry-run" in proc.stdout + proc.stderr
    assert (tmp_path / "gpu_check.log").exists()
