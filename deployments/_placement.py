"""A diagnostics method every deployment body shares: the resources Ray gave this replica."""

from __future__ import annotations

import ray

__all__ = ["PlacementInfo"]


class PlacementInfo:
    """Mixin: ``assigned_resources()`` reports the replica's CPUs/GPUs as Ray scheduled them."""

    async def assigned_resources(self) -> dict[str, float]:
        """Logical resources held by this replica (e.g. ``{"CPU": 0.5, "GPU": 0.25}``)."""
        return dict(ray.get_runtime_context().get_assigned_resources())
