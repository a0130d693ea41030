"""``recallserve bench search-seed``: its bounds are checked before any model loads."""

from __future__ import annotations

from pathlib import Path

import pytest

from recallserve.deployments.cli import main


@pytest.mark.parametrize(("argv", "message"), [
    (["--tenants", "0"], "--tenants"),
    (["--memories", "100"], "--memories"),  # one tenant: at least 1000 rows
    (["--memories", "200", "--tenants", "10000"], "at most 1000000"),
    (["--memories", "100", "--tenants", "10", "--distinct", "5"], "--distinct"),
])
def test_bad_sizes_name_the_argument(argv: list[str], message: str, tmp_path: Path,
                                     capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["bench", "search-seed", "--config", str(tmp_path / "none.yaml"), *argv]) == 2
    assert message in capsys.readouterr().err
