"""``recallserve deploy`` fails with one clear line when there is nothing to roll."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recallserve.deployments.cli import main


def test_deploy_without_a_running_cluster_says_so(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.delenv("RAY_ADDRESS", raising=False)
    profile = yaml.safe_load((Path(__file__).resolve().parents[2] / "deployments/configs/cpu-local.yaml").read_text())
    profile["ray"] = {**profile.get("ray", {}), "temp_dir": str(tmp_path / "ray")}
    path = tmp_path / "p.yaml"
    path.write_text(yaml.safe_dump(profile))
    assert main(["deploy", "--config", str(path)]) == 2
    err = capsys.readouterr().err
    assert "no running Ray cluster found" in err and str(tmp_path / "ray") in err


def test_deploy_rejects_an_invalid_config(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("memory: {migration: {generation: v2, data_dir: x, writes: target}}\n")
    assert main(["deploy", "--config", str(path)]) == 2
    assert "writes: 'target' needs reads" in capsys.readouterr().err
