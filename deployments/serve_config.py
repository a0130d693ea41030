"""Render an :class:`~recallserve.deployments.config.AppConfig` into a Ray Serve config file.

The output is the multi-application Serve config that ``serve deploy`` reads and that KubeRay
embeds verbatim as a RayService's ``spec.serveConfigV2`` (schema: ``ray.serve.schema.
ServeDeploySchema``)::

    proxy_location: EveryNode
    http_options: {host: 0.0.0.0, port: 8000, request_timeout_s: 300}
    logging_config: {encoding: JSON, log_level: INFO}
    applications:
    - name: recallserve
      route_prefix: /
      import_path: deployments.app:app_builder
      args: {...the whole AppConfig as JSON-able values...}
      deployments:
      - {name: ingress, ray_actor_options: {...}, autoscaling_config: {...}, ...}
      - ...

One source of truth: ``args`` carries the validated profile, and ``app_builder(args)`` rebuilds the
``AppConfig`` from it; the ``deployments`` list is derived from the same config
(:meth:`AppConfig.deployment_options`), so the per-deployment resources and autoscaling are
visible (and editable in place) in the Serve config without ever being written twice by hand.
The list holds exactly the deployments the app binds (:func:`app_deployment_names`): Ray Serve
refuses overrides for a deployment the application does not contain.

Targets:
    ``local``: ``http_options`` from ``config.server`` (127.0.0.1 by default), proxy on the head.
    ``kubernetes``: proxies on every node listening on 0.0.0.0 (KubeRay's serve Service targets
    each pod's port), JSON logs (request ids are fields), ``ray.address="auto"`` (join the
    KubeRay cluster), ``memory.data_dir`` moved under the chart's volume (a relative ``state_dir``
    becomes its sibling, on the same volume), sessions, experiences and traces in PostgreSQL
    (``state_db.dsn_env`` = ``RECALLSERVE_STATE_DSN``, a Secret; no ``state`` deployment), and literal API keys
    removed: keys come from the ``RECALLSERVE_API_KEYS`` environment variable (a Secret), never
    from a custom resource that anyone with read access to the namespace can see.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Literal

import yaml

from recallserve.deployments.config import STATE_DSN_ENV, AppConfig, ConfigError

__all__ = [
    "IMPORT_PATH",
    "DEFAULT_K8S_DATA_DIR",
    "K8S_STATE_DSN_ENV",
    "Target",
    "render_serve_config",
    "dump_serve_config",
    "dropped_auth_keys",
    "app_deployment_names",
]

IMPORT_PATH = "recallserve.deployments.app:app_builder"
# NOTE: must stay under the Helm chart's persistence.mountPath (values.yaml); the chart refuses
# a serve config whose memory.data_dir is elsewhere.
DEFAULT_K8S_DATA_DIR = "/data/recallserve/memory"
#: The variable holding the PostgreSQL DSN in the chart's pods (from the stateDatabase Secret).
K8S_STATE_DSN_ENV = STATE_DSN_ENV
Target = Literal["local", "kubernetes"]
_TARGETS = ("local", "kubernetes")


def _k8s_args(config: AppConfig, data_dir: str) -> dict[str, Any]:
    """The config as ``args`` for a pod in a KubeRay cluster (see the module docstring)."""
    if not data_dir.startswith("/"):
        raise ConfigError(f"data_dir: must be an absolute path inside the pod, got {data_dir!r}")
    args = config.model_dump(mode="json")
    args["ray"]["address"] = "auto"
    # NOTE: the pods' environment picks the ingress (the chart's serveThroughputOptimized), not this file.
    args["ray"]["ingress"] = "proxy"
    args["memory"]["data_dir"] = data_dir
    if not str(args["state_dir"]).startswith("/"):
        # NOTE: sessions and experiences live beside the shards, on the same volume (a relative
        # state_dir would be inside the container and lost with the pod).
        args["state_dir"] = str(Path(data_dir).parent / Path(args["state_dir"]).name)
    migration = args["memory"].get("migration")
    if migration and not str(migration["data_dir"]).startswith("/"):
        # NOTE: a relative migration folder becomes a sibling of data_dir, on the same volume.
        migration["data_dir"] = str(Path(data_dir).parent / Path(migration["data_dir"]).name)
    # NOTE: sessions, experiences and traces in PostgreSQL (the chart fills the variable from its
    # stateDatabase Secret): every ingress replica talks to the database, no state replica on a volume.
    if not args["state_db"].get("dsn_env"):
        args["state_db"]["dsn_env"] = K8S_STATE_DSN_ENV
    args["auth"]["keys"] = {}
    if not args["auth"].get("keys_env"):
        args["auth"]["keys_env"] = "RECALLSERVE_API_KEYS"
    # NOTE: validate the rewritten args once more, so a kubernetes render is always an AppConfig
    # that app_builder accepts (e.g. the GPU check no longer applies once ray.address is set).
    AppConfig.model_validate(args)
    return args


def app_deployment_names(config: AppConfig) -> list[str]:
    """Names of the deployments that ``build_app(config)`` binds (ingress first, as in the config).

    Ray Serve rejects a config whose ``deployments`` list names a deployment the application does
    not contain ("Deployment 'x' does not exist"), so the overrides are limited to these. They
    come from the same config method ``build_app`` binds from (public API only); the unit tests
    cross-check them against Ray's own application builder.
    """
    from recallserve.deployments.app import deployment_names

    return deployment_names(config)


def dropped_auth_keys(config: AppConfig, target: Target) -> int:
    """How many literal API keys a render for ``target`` leaves out (0 for ``local``)."""
    return len(config.auth.keys) if target == "kubernetes" else 0


def render_serve_config(
    config: AppConfig,
    *,
    target: Target = "local",
    data_dir: str | None = None,
    route_prefix: str = "/",
    runtime_env: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Build the Ray Serve config dict for one recallserve application.

    Args:
        config: a validated cluster config (``load_config(...)``).
        target: ``local`` (``serve deploy`` on a VM) or ``kubernetes`` (KubeRay ``serveConfigV2``).
        data_dir: ``kubernetes`` only: the shard data folder inside the pods; default
            :data:`DEFAULT_K8S_DATA_DIR`.
        route_prefix: HTTP prefix of the application (the OpenAI paths hang below it).
        runtime_env: optional Ray runtime_env of the application (e.g. ``{"env_vars": {...}}``);
            the container image already holds the code, so no ``working_dir`` is needed.

    Returns:
        A dict that ``yaml.safe_dump`` writes as the Serve config file.

    Raises:
        ConfigError: an unknown target, a relative ``data_dir`` or a bad ``route_prefix``.

    Example:
        >>> from recallserve.deployments.config import load_config
        >>> cfg = render_serve_config(load_config("cpu-local"))
        >>> cfg["applications"][0]["import_path"]
        'recallserve.deployments.app:app_builder'
    """
    if target not in _TARGETS:
        raise ConfigError(f"target: expected one of {', '.join(_TARGETS)}, got {target!r}")
    if not route_prefix.startswith("/"):
        raise ConfigError(f"route_prefix: must start with '/', got {route_prefix!r}")
    if data_dir is not None and target != "kubernetes":
        raise ConfigError("data_dir: only used with target 'kubernetes' (set memory.data_dir in the profile)")
    if target == "kubernetes":
        args = _k8s_args(config, data_dir or DEFAULT_K8S_DATA_DIR)
        config = AppConfig.model_validate(args)  # NOTE: its deployments (no `state`: PostgreSQL) are the render's
        http = {"host": "0.0.0.0", "port": config.server.port, "request_timeout_s": config.http_timeout_s}
        proxy_location = "EveryNode"
    else:
        args = config.model_dump(mode="json")
        http = {
            "host": config.server.host,
            "port": config.server.port,
            "request_timeout_s": config.http_timeout_s,
        }
        proxy_location = "HeadOnly"
    options = config.deployment_options()
    names = app_deployment_names(config)
    deployments = [{"name": name, **options[name].to_ray_options()} for name in names if name in options]
    app: dict[str, Any] = {
        "name": config.name,
        "route_prefix": route_prefix,
        "import_path": IMPORT_PATH,
        "args": args,
        "deployments": deployments,
    }
    if runtime_env:
        app["runtime_env"] = dict(runtime_env)
    out: dict[str, Any] = {"proxy_location": proxy_location, "http_options": http}
    if target == "kubernetes":
        # NOTE: JSON logs carry request_id, deployment and replica as fields for the log stack.
        out["logging_config"] = {"encoding": "JSON", "log_level": "INFO"}
    out["applications"] = [app]
    return out


def dump_serve_config(serve_config: dict[str, Any], path: str | Path | None = None) -> str:
    """YAML text of a rendered config (key order kept); also written to ``path`` when given."""
    text = yaml.safe_dump(serve_config, sort_keys=False, default_flow_style=False, width=120)
    if path is not None:
        Path(path).write_text(text)
    return text
