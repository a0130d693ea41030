"""The Ray Serve config renderer and ``recallserve serve-config``: every profile renders into a
config Ray's own schema accepts, ``args`` round-trips to the same AppConfig, the Kubernetes
target drops literal keys, and the chart's committed renders match the profiles."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest
import yaml

from recallserve.deployments.config import AppConfig, ConfigError, list_profiles, load_config
from recallserve.deployments.serve_config import (
    DEFAULT_K8S_DATA_DIR,
    IMPORT_PATH,
    app_deployment_names,
    dropped_auth_keys,
    dump_serve_config,
    render_serve_config,
)

ROOT = Path(__file__).resolve().parents[2]
CHART_RENDERS = {
    "cpu-local": ROOT / "helm/recallserve/files/serve-config-cpu.yaml",
    "gpu-cluster": ROOT / "helm/recallserve/files/serve-config-gpu.yaml",
}


def _cli(argv: list[str]) -> int:
    from recallserve.deployments.cli import _serve_config

    parser = argparse.ArgumentParser()
    _serve_config.add_parser(parser.add_subparsers())
    args = parser.parse_args(["serve-config", *argv])
    return args.func(args)


@pytest.mark.parametrize("profile", list_profiles())
@pytest.mark.parametrize("target", ["local", "kubernetes"])
def test_every_profile_renders_and_round_trips(profile: str, target: str) -> None:
    config = load_config(profile)
    out = render_serve_config(config, target=target)
    (app,) = out["applications"]
    assert app["import_path"] == IMPORT_PATH
    assert app["route_prefix"] == "/"
    rebuilt = AppConfig.model_validate(app["args"])
    if target == "local":
        assert rebuilt == config
    else:
        assert rebuilt.ray.address == "auto"
        assert rebuilt.auth.keys == {}
        assert str(rebuilt.memory.data_dir) == DEFAULT_K8S_DATA_DIR
        assert str(rebuilt.state_dir) == "/data/recallserve/state"
        # sessions, experiences and traces in PostgreSQL (the chart's Secret): no state replica
        assert rebuilt.state_db.dsn_env == "RECALLSERVE_STATE_DSN" and "state" not in rebuilt.deployment_options()
        # NOTE: everything else is the profile unchanged.
        changed = {"ray", "auth", "memory", "state_dir", "state_db"}
        assert rebuilt.model_dump(exclude=changed) == config.model_dump(exclude=changed)
        config = rebuilt
    # The deployments list holds the options of exactly the deployments the app binds.
    expected = {name: opts.to_ray_options() for name, opts in config.deployment_options().items()}
    names = [d["name"] for d in app["deployments"]]
    assert names == app_deployment_names(config) and sorted(names) == sorted(_ray_built_names(config))
    assert "ingress" in names and set(names) <= set(expected)
    for dep in app["deployments"]:
        assert {k: v for k, v in dep.items() if k != "name"} == expected[dep["name"]]
    # YAML text parses back to the same dict (what serve deploy and KubeRay read).
    assert yaml.safe_load(dump_serve_config(out)) == out


@pytest.mark.parametrize("profile", list_profiles())
def test_rendered_config_passes_ray_serve_schema(profile: str) -> None:
    pytest.importorskip("ray.serve.schema", reason="Ray Serve is not installed")
    sys.path.append(str(ROOT))
    from scripts.validate_chart import check_serve_config

    text = dump_serve_config(render_serve_config(load_config(profile), target="kubernetes"))
    assert check_serve_config(text) == []


def test_ray_schema_check_catches_a_misspelt_option() -> None:
    pytest.importorskip("ray.serve.schema", reason="Ray Serve is not installed")
    sys.path.append(str(ROOT))
    from scripts.validate_chart import check_serve_config

    out = render_serve_config(load_config("cpu-local"))
    out["applications"][0]["deployments"][0]["autoscaling_config"] = {"min_replicas": 1, "max_replicaz": 3}
    errors = check_serve_config(dump_serve_config(out))
    assert errors and "max_replicaz" in errors[0]


def test_targets_set_http_options_and_proxy() -> None:
    config = load_config("cpu-local")
    local = render_serve_config(config)
    assert local["http_options"]["host"] == config.server.host
    assert local["http_options"]["port"] == config.server.port
    assert local["proxy_location"] == "HeadOnly"
    assert "logging_config" not in local
    k8s = render_serve_config(config, target="kubernetes", data_dir="/mnt/shards")
    assert k8s["http_options"]["host"] == "0.0.0.0"
    assert k8s["proxy_location"] == "EveryNode"
    assert k8s["logging_config"]["encoding"] == "JSON"
    assert k8s["applications"][0]["args"]["memory"]["data_dir"] == "/mnt/shards"
    assert k8s["applications"][0]["args"]["state_dir"] == "/mnt/state"  # sessions and experiences on the volume
    assert dropped_auth_keys(config, "kubernetes") == len(config.auth.keys) > 0
    assert dropped_auth_keys(config, "local") == 0


def test_runtime_env_is_passed_through() -> None:
    out = render_serve_config(load_config("cpu-local"), runtime_env={"env_vars": {"A": "1"}})
    assert out["applications"][0]["runtime_env"] == {"env_vars": {"A": "1"}}


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"target": "k8s"}, "target"),
        ({"target": "kubernetes", "data_dir": "relative/dir"}, "data_dir"),
        ({"target": "local", "data_dir": "/abs"}, "data_dir"),
        ({"route_prefix": "api"}, "route_prefix"),
    ],
)
def test_bad_arguments_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(ConfigError, match=field):
        render_serve_config(load_config("cpu-local"), **kwargs)


def test_cli_writes_a_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    out = tmp_path / "serve.yaml"
    assert _cli(["--profile", "cpu-local", "--target", "kubernetes", "--out", str(out)]) == 0
    assert "left out 1 literal API key" in capsys.readouterr().err
    data = yaml.safe_load(out.read_text())
    assert data["applications"][0]["args"]["auth"]["keys"] == {}


def test_cli_check_detects_drift(tmp_path: Path) -> None:
    stale = tmp_path / "stale.yaml"
    stale.write_text("applications: []\n")
    assert _cli(["--profile", "cpu-local", "--check", str(stale)]) == 1


def test_cli_unknown_profile_is_a_user_error() -> None:
    from recallserve.deployments.cli import UserError

    with pytest.raises(UserError, match="unknown profile"):
        _cli(["--profile", "no-such-profile"])


@pytest.mark.parametrize("profile", sorted(CHART_RENDERS))
def test_chart_renders_are_in_sync_with_profiles(profile: str) -> None:
    # NOTE: the chart ships renders of the profiles (Helm cannot run Python); this keeps them the
    # single source of truth. On failure regenerate with the command in the message.
    path = CHART_RENDERS[profile]
    expected = dump_serve_config(render_serve_config(load_config(profile), target="kubernetes"))
    assert path.read_text() == expected, (
        f"{path.relative_to(ROOT)} is stale: run `recallserve serve-config --profile {profile} "
        f"--target kubernetes --out {path.relative_to(ROOT)}`"
    )


def _ray_built_names(config: AppConfig) -> list[str]:
    """What Ray's own (internal) builder makes of ``build_app(config)``: the cross-check of
    ``app_deployment_names``. Test-only use of ``ray.serve._private``; it fails loudly if it moves."""
    from ray.serve._private.build_app import build_app as ray_build

    from recallserve.deployments.app import build_app

    return [d.name for d in ray_build(build_app(config), name=config.name).deployments]
