"""Every data file the packages read is shipped in a non-editable install (the image)."""

from __future__ import annotations

import fnmatch
import tomllib
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGES = ("serve", "deployments", "memory_shards", "kernels")


def test_package_data_covers_every_non_python_file() -> None:
    globs = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["package-data"]
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


def test_the_installed_packages_are_the_projects_own() -> None:
    """No other distribution's top-level module (PyPI's ``kernels``) shadows one of ours."""
    from deployments.cli import check_own_packages

    check_own_packages()


def test_a_shadowing_package_is_one_clear_error(tmp_path: Path, monkeypatch) -> None:
    """A stray ``kernels`` ahead on the path makes the CLI say which module and what to run."""
    import sys

    from deployments.cli import main

    (tmp_path / "kernels").mkdir()
    (tmp_path / "kernels" / "__init__.py").write_text("")
    monkeypatch.syspath_prepend(str(tmp_path))
    for name in [m for m in sys.modules if m == "kernels" or m.startswith("kernels.")]:
        monkeypatch.delitem(sys.modules, name)
    import importlib

    importlib.invalidate_caches()
    assert main(["models", "list"]) == 2
