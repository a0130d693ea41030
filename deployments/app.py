"""Build the Ray Serve application from an :class:`~recallserve.deployments.config.AppConfig`.

Deployments are plain classes wrapped here with ``serve.deployment(...)`` and options that come
from config only (STYLE habit 3). ``app_builder`` is the import path for Ray Serve config files
and KubeRay's ``serveConfigV2``.
"""

from __future__ import annotations

from typing import Any

from ray import serve
from ray.serve import Application

from recallserve.deployments._versions import pin_version
from recallserve.deployments.config import ROLES, AppConfig
from recallserve.deployments.ingress import Ingress
from recallserve.deployments.memory import bind_memory
from recallserve.deployments.roles import ModelRole
from recallserve.deployments.state import StateStore

__all__ = ["build_app", "app_builder", "deployment_names"]


def deployment_names(config: AppConfig) -> list[str]:
    """Names of every deployment of the app, in deploy order."""
    return list(config.deployment_options())


def build_app(config: AppConfig) -> Application:
    """Bind every deployment of the cluster into one application (ingress last)."""
    opts = config.deployment_options()
    roles: dict[str, Application] = {}
    for role in ROLES:
        rc = getattr(config, role)
        if rc.own_deployment:
            dep = serve.deployment(ModelRole, name=role).options(**opts[role].to_ray_options())
            roles[role] = pin_version(dep, role, role, rc.engine.model_dump(mode="json")).bind(role, rc.engine)
    for role in ROLES:
        # NOTE: a shared role's calls go to its host's replicas: one engine process, one queue.
        if (host := getattr(config, role).shared_with) is not None:
            roles[role] = roles[host]
    # NOTE: serve.ingress() with no app defers the ASGI app to Ingress.__serve_build_asgi_app__,
    # which runs on the replica after __init__ received the resolved handles.
    embedder, generations = bind_memory(config)
    ingress = serve.deployment(serve.ingress()(Ingress), name="ingress").options(**opts["ingress"].to_ray_options())
    data = config.model_dump(mode="json")
    # NOTE: replicas may not share the driver's working folder; pin relative paths now.
    data["state_dir"] = str(config.state_dir.expanduser().resolve())
    state = None
    if "state" in opts:  # NOTE: without a PostgreSQL DSN, one state replica owns the SQLite files
        state_dep = serve.deployment(StateStore, name="state").options(**opts["state"].to_ray_options())
        state = pin_version(state_dep, "state", data["state_dir"], data["traces"]).bind(data["state_dir"], data["traces"])
    # NOTE: the bound roles, memory and state deployments follow from the same config, so its
    # data is the whole of what the ingress is built from.
    return pin_version(ingress, "ingress", data).bind(data, roles, {"embedder": embedder, "generations": generations},
                                                      state)


def app_builder(args: dict[str, Any]) -> Application:
    """Ray Serve config-file entry point: ``import_path: deployments.app:app_builder``.

    Args:
        args: an ``AppConfig`` as plain data (what ``recallserve serve-config`` renders).
    """
    return build_app(AppConfig.model_validate(args))
