#!/usr/bin/env python
"""Validate the Helm chart offline: lint, render, Kubernetes schemas, and a RayService check.

For each values set (default values, then ``values-gpu.yaml``):

1. ``helm lint --strict`` (values.schema.json is applied by helm itself);
2. ``helm template`` piped into ``kubernetes-validate --strict -`` (built-in kinds against the
   Kubernetes JSON schemas; unknown properties rejected). kubernetes-validate has no schema for
   custom resources: it prints ``WARN ... Couldn't find schema for kind`` and does not fail (there
   is no flag to fail on them; ``--no-warn`` only hides the line). Only the CRD kinds listed in
   :data:`CRD_KINDS` may be skipped that way; any other missing schema fails;
3. a focused check of the RayService, since no PyPI package ships KubeRay's CRD schema:
   the fields and ``required`` lists of KubeRay's ``ray.io_rayservices.yaml`` (ray.io/v1) that the
   chart uses, every head/worker pod template validated as a core/v1 Pod with
   kubernetes-validate's strict schema, and ``serveConfigV2`` validated with Ray's own
   ``ray.serve.schema.ServeDeploySchema`` when Ray is installed;
4. the PrometheusRule (alerts) against the fields of the operator's CRD it uses, each rule's
   ``expr`` parsed as PromQL.

Usage: ``python scripts/validate_chart.py`` (exit 0 when everything passes).
"""

from __future__ import annotations

import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import jsonschema
import yaml

ROOT = Path(__file__).resolve().parents[1]
CHART = ROOT / "helm" / "recallserve"
VALUE_SETS: dict[str, list[Path]] = {"default": [], "gpu": [CHART / "values-gpu.yaml"]}
CRD_KINDS = {"RayService", "ServiceMonitor", "PrometheusRule"}
# NOTE: pinned so that a newer kubernetes-validate (new schema sets) does not move the result;
# 1.35 matches the kubectl/helm client in the PyPI wheel the helm binary comes from.
K8S_VERSION = "1.35.0"

_STR_MAP = {"type": "object", "additionalProperties": {"type": "string"}}
_TEMPLATE = {
    "type": "object",
    "required": ["spec"],
    "properties": {"metadata": {"type": "object"}, "spec": {"type": "object", "required": ["containers"]}},
    "additionalProperties": False,
}
# The parts of KubeRay's RayService CRD (ray.io/v1) the chart renders: names, types and the
# CRD's required lists (workerGroupSpecs: groupName, maxReplicas, minReplicas, rayStartParams,
# template; rayClusterConfig: headGroupSpec).
RAYSERVICE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "ray.io/v1"},
        "kind": {"const": "RayService"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object",
            "required": ["serveConfigV2", "rayClusterConfig"],
            "additionalProperties": False,
            "properties": {
                "serveConfigV2": {"type": "string"},
                "serveService": {"type": "object"},
                "upgradeStrategy": {"type": "object"},
                "rayClusterConfig": {
                    "type": "object",
                    "required": ["headGroupSpec"],
                    "additionalProperties": False,
                    "properties": {
                        "rayVersion": {"type": "string"},
                        "enableInTreeAutoscaling": {"type": "boolean"},
                        "gcsFaultToleranceOptions": {
                            "type": "object",
                            "required": ["redisAddress"],
                            "additionalProperties": False,
                            "properties": {
                                "redisAddress": {"type": "string", "minLength": 1},
                                "redisUsername": {"type": "object"},
                                "redisPassword": {"type": "object"},
                                "externalStorageNamespace": {"type": "string"},
                            },
                        },
                        "autoscalerOptions": {
                            "type": "object",
                            "additionalProperties": False,
                            "properties": {
                                "upscalingMode": {"enum": ["Default", "Aggressive", "Conservative"]},
                                "idleTimeoutSeconds": {"type": "integer", "minimum": 0},
                                "resources": {"type": "object"},
                                "env": {"type": "array"},
                                "image": {"type": "string"},
                                "imagePullPolicy": {"type": "string"},
                            },
                        },
                        "headGroupSpec": {
                            "type": "object",
                            "required": ["rayStartParams", "template"],
                            "additionalProperties": False,
                            "properties": {"rayStartParams": _STR_MAP, "template": _TEMPLATE, "serviceType": {"type": "string"}},
                        },
                        "workerGroupSpecs": {
                            "type": "array",
                            "items": {
                                "type": "object",
                                "required": ["groupName", "maxReplicas", "minReplicas", "rayStartParams", "template"],
                                "additionalProperties": False,
                                "properties": {
                                    "groupName": {"type": "string", "minLength": 1},
                                    "replicas": {"type": "integer", "minimum": 0},
                                    "minReplicas": {"type": "integer", "minimum": 0},
                                    "maxReplicas": {"type": "integer", "minimum": 0},
                                    "rayStartParams": _STR_MAP,
                                    "template": _TEMPLATE,
                                },
                            },
                        },
                    },
                },
            },
        },
    },
}


@dataclass
class Report:
    """What one values set produced: the manifests and every problem found."""

    name: str
    docs: list[dict[str, Any]] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    skipped_kinds: set[str] = field(default_factory=set)

    @property
    def ok(self) -> bool:
        return not self.errors


def _helm_args(values: list[Path]) -> list[str]:
    return [a for v in values for a in ("-f", str(v))]


def check_rayservice(doc: dict[str, Any]) -> list[str]:
    """Problems in one rendered RayService (empty when it passes)."""
    import kubernetes_validate

    errors = [
        f"RayService {'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}"
        for e in jsonschema.Draft202012Validator(RAYSERVICE_SCHEMA).iter_errors(doc)
    ]
    if errors:
        return errors
    rc = doc["spec"]["rayClusterConfig"]
    groups = [("head", rc["headGroupSpec"])] + [(g["groupName"], g) for g in rc.get("workerGroupSpecs", [])]
    for name, group in groups:
        tpl = group["template"]
        pod = {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": f"check-{name}", **tpl.get("metadata", {})}, "spec": tpl["spec"]}
        try:
            kubernetes_validate.validate(pod, K8S_VERSION, strict=True)
        except kubernetes_validate.ValidationError as exc:
            errors.append(f"RayService group {name}: pod template {'.'.join(map(str, exc.path))}: {exc.message}")
    for name, group in groups[1:]:
        if group["minReplicas"] > group["maxReplicas"]:
            errors.append(f"RayService group {name}: minReplicas above maxReplicas")
    errors.extend(check_serve_config(doc["spec"]["serveConfigV2"]))
    return errors


def check_serve_config(text: str) -> list[str]:
    """Validate serveConfigV2 text with Ray's ServeDeploySchema (skipped without Ray).

    NOTE: Ray's schema models ignore unknown keys, so a misspelt option would pass silently;
    every key is therefore also checked against the fields of the Ray model it belongs to.
    """
    try:
        from ray.serve.config import AutoscalingConfig
        from ray.serve.schema import DeploymentSchema, RayActorOptionsSchema, ServeApplicationSchema, ServeDeploySchema
    except ImportError:
        return []
    data = yaml.safe_load(text)
    unknown: list[str] = []

    def _keys(where: str, obj: dict[str, Any], model: Any) -> None:
        unknown.extend(f"{where}.{k}" for k in obj if k not in model.model_fields)

    _keys("(root)", data, ServeDeploySchema)
    for i, app in enumerate(data.get("applications") or []):
        _keys(f"applications[{i}]", app, ServeApplicationSchema)
        for j, dep in enumerate(app.get("deployments") or []):
            where = f"applications[{i}].deployments[{j}]"
            _keys(where, dep, DeploymentSchema)
            _keys(f"{where}.ray_actor_options", dep.get("ray_actor_options") or {}, RayActorOptionsSchema)
            _keys(f"{where}.autoscaling_config", dep.get("autoscaling_config") or {}, AutoscalingConfig)
    if unknown:
        return [f"serveConfigV2: keys Ray Serve does not know: {', '.join(unknown)}"]
    validate = getattr(ServeDeploySchema, "model_validate", None) or ServeDeploySchema.parse_obj
    try:
        validate(data)
    except Exception as exc:  # noqa: BLE001 - pydantic v1/v2 errors differ across Ray versions
        return [f"serveConfigV2 fails Ray's ServeDeploySchema: {exc}"]
    return []


_DURATION = {"type": "string", "pattern": "^([0-9]+(ms|s|m|h|d|w|y))+$"}
# The parts of the Prometheus operator's PrometheusRule CRD (monitoring.coreos.com/v1) the chart
# renders: spec.groups[] {name, interval?, rules[]}; a rule {alert | record, expr, for?, labels?,
# annotations?}; group names and expr required.
PROMETHEUSRULE_SCHEMA: dict[str, Any] = {
    "type": "object",
    "required": ["apiVersion", "kind", "metadata", "spec"],
    "properties": {
        "apiVersion": {"const": "monitoring.coreos.com/v1"},
        "kind": {"const": "PrometheusRule"},
        "metadata": {"type": "object", "required": ["name"]},
        "spec": {
            "type": "object", "required": ["groups"], "additionalProperties": False,
            "properties": {"groups": {"type": "array", "minItems": 1, "items": {
                "type": "object", "required": ["name", "rules"], "additionalProperties": False,
                "properties": {
                    "name": {"type": "string", "minLength": 1}, "interval": _DURATION,
                    "rules": {"type": "array", "minItems": 1, "items": {
                        "type": "object", "required": ["expr"], "additionalProperties": False,
                        "oneOf": [{"required": ["alert"]}, {"required": ["record"]}],
                        "properties": {
                            "alert": {"type": "string", "pattern": "^[A-Za-z_][A-Za-z0-9_]*$"},
                            "record": {"type": "string"}, "expr": {"type": "string", "minLength": 1},
                            "for": _DURATION, "labels": _STR_MAP, "annotations": _STR_MAP,
                        },
                    }},
                },
            }}},
        },
    },
}


def check_prometheus_rule(doc: dict[str, Any]) -> list[str]:
    """The PrometheusRule against :data:`PROMETHEUSRULE_SCHEMA`, and every ``expr`` parsed as PromQL
    (``promql-parser``, the Rust port of Prometheus' own parser)."""
    errors = [f"PrometheusRule {'.'.join(map(str, e.absolute_path))}: {e.message}"
              for e in jsonschema.Draft202012Validator(PROMETHEUSRULE_SCHEMA).iter_errors(doc)]
    try:
        import promql_parser
    except ImportError:
        return [*errors, "PrometheusRule: promql-parser is not installed (pip install promql-parser)"]
    for group in (doc.get("spec") or {}).get("groups") or []:
        for rule in group.get("rules") or []:
            try:
                promql_parser.parse(str(rule.get("expr", "")))
            except ValueError as exc:
                errors.append(f"PrometheusRule {rule.get('alert') or rule.get('record')}: expr is not PromQL: {exc}")
    return errors


def check_references(docs: list[dict[str, Any]]) -> list[str]:
    """Cross-object references: the Ingress backend and the ServiceMonitor's ports and selector."""
    errors: list[str] = []
    services = [d for d in docs if d["kind"] == "Service"]
    for rs in (d for d in docs if d["kind"] == "RayService"):
        port = (yaml.safe_load(rs["spec"]["serveConfigV2"]).get("http_options") or {}).get("port", 8000)
        serve_svc = f"{rs['metadata']['name']}-serve-svc"  # NOTE: the Service KubeRay creates
        for ing in (d for d in docs if d["kind"] == "Ingress"):
            for rule in ing["spec"]["rules"]:
                for path in rule["http"]["paths"]:
                    svc = path["backend"]["service"]
                    if svc["name"] != serve_svc or svc["port"].get("number") != port:
                        errors.append(f"Ingress backend {svc} is not {serve_svc}:{port}")
    for sm in (d for d in docs if d["kind"] == "ServiceMonitor"):
        want = sm["spec"]["selector"]["matchLabels"]
        matched = [s for s in services if want.items() <= (s["metadata"].get("labels") or {}).items()]
        if not matched:
            errors.append(f"ServiceMonitor selector {want} matches no Service")
        ports = {p.get("name") for s in matched for p in s["spec"]["ports"]}
        for ep in sm["spec"]["endpoints"]:
            if ep.get("port") not in ports:
                errors.append(f"ServiceMonitor endpoint port {ep.get('port')!r} is not a port of {[s['metadata']['name'] for s in matched]}")
    return errors


def validate_values(helm: Path, name: str, values: list[Path], extra: list[str] | None = None) -> Report:
    """Lint, render and validate the chart for one values set."""
    report = Report(name)
    lint = subprocess.run([str(helm), "lint", "--strict", str(CHART), *_helm_args(values), *(extra or [])],
                          capture_output=True, text=True, timeout=120)
    if lint.returncode != 0:
        report.errors.append(f"helm lint --strict failed:\n{lint.stdout}{lint.stderr}")
        return report
    tpl = subprocess.run([str(helm), "template", "rs", str(CHART), *_helm_args(values), *(extra or [])],
                         capture_output=True, text=True, timeout=120)
    if tpl.returncode != 0:
        report.errors.append(f"helm template failed: {tpl.stderr.strip()}")
        return report
    report.docs = [d for d in yaml.safe_load_all(tpl.stdout) if d]
    kv = subprocess.run([sys.executable, "-m", "kubernetes_validate", "--strict", "-k", K8S_VERSION, "-"],
                        input=tpl.stdout, capture_output=True, text=True, timeout=120)
    for line in kv.stdout.splitlines():
        if line.startswith(("ERROR", "FATAL")):
            report.errors.append(line)
        elif line.startswith("WARN"):
            kind = line.split("for kind ", 1)[-1].split(" ", 1)[0] if "for kind " in line else ""
            if kind in CRD_KINDS:
                report.skipped_kinds.add(kind)
            else:
                report.errors.append(line)
    if kv.returncode != 0 and not report.errors:
        report.errors.append(f"kubernetes-validate exited {kv.returncode}: {kv.stdout[-500:]}{kv.stderr[-500:]}")
    for doc in report.docs:
        if doc.get("kind") == "RayService":
            report.errors.extend(check_rayservice(doc))
        elif doc.get("kind") == "PrometheusRule":
            report.errors.extend(check_prometheus_rule(doc))
    report.errors.extend(check_references(report.docs))
    return report


def main() -> int:
    sys.path.append(str(ROOT))  # NOTE: for `scripts`; behind site-packages, where kernels/ shadows nothing
    from scripts.get_helm import HelmUnavailable, ensure_helm

    try:
        helm = ensure_helm()
    except HelmUnavailable as exc:
        print(f"validate_chart: error: {exc}", file=sys.stderr)
        return 2
    failed = 0
    for name, values in VALUE_SETS.items():
        rep = validate_values(helm, name, values)
        kinds = sorted({d["kind"] for d in rep.docs})
        status = "ok" if rep.ok else "FAILED"
        print(f"[{name}] {status}: {len(rep.docs)} manifests ({', '.join(kinds)}); "
              f"custom kinds without a Kubernetes schema (checked here instead): {', '.join(sorted(rep.skipped_kinds)) or '-'}")
        for err in rep.errors:
            print(f"  {err}")
        failed += not rep.ok
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
