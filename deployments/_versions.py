"""Deployment versions for ``serve.run``: a roll-out restarts only the deployments that changed.

``serve.run`` gives every deployment without a version a new random one, so each redeploy
(``recallserve deploy``) would restart every replica, models included. Here each deployment's
version is::

    sha256(code || name || canonical JSON of its init arguments)[:16]
    code = sha256 over every .py file of the packages serve, deployments, memory_shards, kernels

so a deployment keeps its replicas when neither the code nor its own arguments changed (its
options, such as replicas or autoscaling, are applied in place by Serve as usual).

NOTE: Ray Serve removed ``version`` from the public options; ``_internal=True`` is how Serve
sets it itself. A config-file deploy (KubeRay ``serveConfigV2``) does not use this: there Serve
versions every deployment of an app by a hash of the app's arguments.
"""

from __future__ import annotations

import functools
import hashlib
import json
from pathlib import Path
from typing import Any

__all__ = ["code_version", "deployment_version", "pin_version"]

_PACKAGES = ("serve", "deployments", "memory_shards", "kernels")


@functools.lru_cache(maxsize=1)
def code_version() -> str:
    """Hash of the project's Python sources (what a replica imports)."""
    root = Path(__file__).resolve().parents[1]
    digest = hashlib.sha256()
    for package in _PACKAGES:
        for path in sorted((root / package).rglob("*.py")):
            digest.update(str(path.relative_to(root)).encode())
            digest.update(path.read_bytes())
    return digest.hexdigest()


def deployment_version(name: str, *args: Any) -> str:
    """Version of deployment ``name`` built with ``args`` (JSON-serialisable after ``default=str``)."""
    body = json.dumps([name, list(args)], sort_keys=True, default=str)
    return hashlib.sha256((code_version() + body).encode()).hexdigest()[:16]


def pin_version(deployment: Any, name: str, *args: Any) -> Any:
    """``deployment`` with the version of :func:`deployment_version`."""
    return deployment.options(version=deployment_version(name, *args), _internal=True)
