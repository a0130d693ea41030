"""Every data file the packages read is shipped in a non-editable install (the image)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("serve", "deployments", "memory_shards", "kernels")


def test_package_data_covers_every_non_python_file() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
    globs = {k.removeprefix("recallserve."): v for k, v in globs.items()}
    missing = []
    for package in PACKAGES:
        for path in (ROOT / package).rglob("*"):
            if not path.is_file() or path.suffix in (".py", ".pyc") or "__pycache__" in path.parts:
                continue
            rel = path.relative_to(ROOT / package).as_posix()
            if not any(fnmatch.fnmatch(rel, g) for g in globs.get(package, [])):
                missing.append(f"{package}/{rel}")
    assert missing == [], f"add to [tool.setuptools.package-data]: {missing}"


def test_ci_runs_the_readme_commands_and_nothing_else() -> None:
    """``.ci/run`` may only time and echo; every command it runs is written in the README."""
    readme = (ROOT / "README.md").read_text()
    # NOTE: the script's own plumbing (strict mode, working folder, quiet pip, timing lines).
    plumbing = ("set -euo pipefail", 'cd "$(dirname "$0")/.."', "export PIP_PROGRESS_BAR=off", "start=$(date +%s)",
                'echo "ci: ')
    commands = [line.strip() for line in (ROOT / ".ci" / "run").read_text().splitlines()]
    commands = [c for c in commands if c and not c.startswith("#") and not c.startswith(plumbing)]
    assert commands, "no command found in .ci/run"
    assert [c for c in commands if c not in readme] == []


def test_the_package_list_names_every_package_folder() -> None:
    """pyproject's explicit ``packages`` (mapped under ``recallserve``) miss no folder with modules."""
    setuptools = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]
    listed = set(setuptools["packages"])
    # NOTE: a folder pyproject maps under its own name (serve/client -> recallserve.client) is named so.
    mapped = {folder: name for name, folder in setuptools["package-dir"].items()}

    def name(folder: Path) -> str:
        rel = folder.relative_to(ROOT).as_posix()
        return mapped.get(rel) or "recallserve." + ".".join(folder.relative_to(ROOT).parts)

    found = {name(p.parent) for package in PACKAGES for p in (ROOT / package).rglob("*.py") if "__pycache__" not in p.parts}
    assert found - listed == set() and listed - found == set()


def test_the_only_top_level_name_is_recallserve() -> None:
    """The installed distribution puts one name into site-packages: ``recallserve`` (nothing generic to shadow)."""
    import sys
    from importlib.metadata import distributions

    # NOTE: the installed copy's record, not the build's egg-info that `pip install -e .` leaves in the checkout.
    outside = [p for p in sys.path if Path(p or ".").resolve() != ROOT]
    dist = next(iter(distributions(name="recallserve", path=outside)))
    tops = {(f.parts[0] if len(f.parts) > 1 else f.stem) for f in dist.files or []
            if not f.parts[0].endswith((".dist-info", ".pth")) and not f.parts[0].startswith("__editable__")
            and f.parts[0] not in ("..", "bin", "__pycache__")}
    assert tops <= {"recallserve"}, tops
    import recallserve.kernels
    import recallserve.serve

    assert Path(recallserve.kernels.__file__).parent == ROOT / "kernels"
    assert Path(recallserve.serve.__file__).parent == ROOT / "serve"


def test_hugging_face_kernels_installs_beside_ours() -> None:
    """PyPI's ``kernels`` (a dependency of newer transformers) and ``recallserve.kernels`` are two modules."""
    import importlib.util

    spec = importlib.util.find_spec("kernels")
    if spec is not None:  # installed with transformers >= 5.25: it must be theirs, not ours
        assert Path(spec.origin or "").resolve().parent != ROOT / "kernels"
    import recallserve.kernels

    assert hasattr(recallserve.kernels, "fused_topk")


def test_run_from_the_checkout_the_generic_kernels_name_is_not_ours() -> None:
    """``python -c``/``-m`` in the checkout puts its root first on sys.path: after importing the project,
    ``import kernels`` (what transformers does) must not find the folder ``kernels/``."""
    import subprocess
    import sys

    code = ("import importlib.util, recallserve.kernels; s = importlib.util.find_spec('kernels'); "
            "print(s.origin if s else 'none')")
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120, check=True)
    assert Path(out.stdout.strip()).resolve().parent != ROOT / "kernels", out.stdout


def test_the_checkout_root_moves_behind_site_packages() -> None:
    from recallserve.kernels import checkout_root_after_site_packages

    path = ["", "/usr/lib/python3.11", str(ROOT), "/site-packages"]
    import os

    here = os.getcwd()
    os.chdir(ROOT)
    try:
        assert checkout_root_after_site_packages(path) is True
    finally:
        os.chdir(here)
    assert path == ["/usr/lib/python3.11", "/site-packages", "", str(ROOT)]
    assert checkout_root_after_site_packages(path) is False
