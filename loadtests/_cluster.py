"""The config the cluster checks start: a profile in scratch folders, chat roles on a small model.

Both ``autoscale_check`` and ``reembed_check`` start their own cluster on 127.0.0.1 and must
touch neither a running ``recallserve up`` nor its data, so memory, sessions and Ray's files go
to a scratch folder, and the three chat roles use one thread of a small model each (the checks
measure scaling and roll-outs, not generation, on 2 shared cores).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

__all__ = ["scratch_config"]


def scratch_config(profile: str, port: int, scratch: Path, model: str, **overrides: Any) -> Any:
    """``profile`` with its folders under ``scratch``, HTTP on 127.0.0.1:``port`` and ``model`` for the roles.

    Args:
        overrides: further top-level sections merged over the profile (e.g. ``agent_enabled=False``).
    """
    from recallserve.deployments.config import ROLES, load_config
    from recallserve.deployments.engines import LlamaCppConfig

    config = load_config(profile, overrides={
        "server": {"host": "127.0.0.1", "port": port}, "memory": {"data_dir": str(scratch / "memory")},
        "state_dir": str(scratch / "state"), "ray": {"temp_dir": str(scratch / "ray")}, **overrides})
    for role in ROLES:
        engine = getattr(config, role).engine
        if isinstance(engine, LlamaCppConfig):
            getattr(config, role).engine = LlamaCppConfig.model_validate({**engine.model_dump(), "model": model, "n_threads": 1})
    return config
