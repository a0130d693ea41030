"""``recallserve bench``: every benchmark is a subcommand, with the shared arguments and report files."""

from __future__ import annotations

import ast
import json
from pathlib import Path

import pytest

from recallserve.deployments.cli import COMMANDS, main

ROOT = Path(__file__).resolve().parents[2]
# NOTE: modules of deployments/cli that serve the bench subcommands without being one.
_HELPERS = {"_bench_args", "_bench_ingest_cluster"}
_NOT_PRODUCT = {"tests", "deployments", "serve", "kernels", "memory_shards"}


def test_every_bench_module_is_a_subcommand() -> None:
    modules = {p.stem for p in (ROOT / "deployments" / "cli").glob("_bench_*.py")} - _HELPERS
    registered = {m.rsplit(".", 1)[1] for c, m in COMMANDS.items() if c.startswith("bench ")}
    assert modules == registered


def test_bench_kernels_writes_its_rows_to_out_as_json(tmp_path: Path, capsys) -> None:
    assert main(["bench", "kernels", "--rows", "2k", "--dim", "32", "--queries", "2", "--k", "3", "--repeats", "1",
                 "--threads", "1", "--out", str(tmp_path / "k")]) == 0
    rows = json.loads((tmp_path / "k.json").read_text())
    assert rows[0]["impl"] == "torch-cpu" and rows[0]["n"] == 2000 and rows[0]["ms_median"] > 0
    assert f"wrote {tmp_path / 'k.json'}" in capsys.readouterr().out


@pytest.mark.parametrize(("argv", "flag"), [
    (["bench", "gather", "--clients", "1,x"], "--clients"),
    (["bench", "kernels", "--rows", "lots"], "--rows"),
    (["bench", "restart", "--repeats", "0"], "--repeats"),
    (["bench", "scan-layout", "--queries", "999"], "--queries"),
])
def test_a_bad_shared_argument_is_one_line_naming_the_flag(argv: list[str], flag: str, capsys) -> None:
    assert main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"recallserve: error: {flag}")


def test_locomo_is_named_by_the_user_not_a_path_outside_the_repository(capsys) -> None:
    for bench in ("ingest", "api-search"):
        with pytest.raises(SystemExit) as exc:
            main(["bench", bench])
        assert exc.value.code == 2 and "--locomo" in capsys.readouterr().err


def test_loadtests_import_only_the_product_and_point_inside_the_repository() -> None:
    for path in (ROOT / "loadtests").glob("*.py"):
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [node.module or ""] if isinstance(node, ast.ImportFrom) else (
                [a.name for a in node.names] if isinstance(node, ast.Import) else [])
            # NOTE: the project's own code only as the installed ``recallserve``; never the test helpers.
            assert not any(n.split(".")[0] in _NOT_PRODUCT for n in names), (path, names)
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                assert "../shared/" not in node.value and not node.value.startswith("/work/"), (path, node.value)
