"""Per-deployment resource, replica and autoscaling options, turned into Ray Serve options.

Kept free of Ray imports: :meth:`DeploymentOptions.to_ray_options` returns the plain dict that
``serve.deployment(...).options(**opts)`` accepts, so profiles are validated without a cluster.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import Field, model_validator

from recallserve.kernels import StrictModel

__all__ = ["AutoscalingOptions", "DeploymentOptions", "REQUEST_ROUTERS"]


class AutoscalingOptions(StrictModel):
    """Ray Serve autoscaling for one deployment (replicas follow ongoing requests per replica)."""

    min_replicas: int = Field(default=1, ge=0, le=1000, description="Fewest replicas kept running.")
    max_replicas: int = Field(default=1, ge=1, le=1000, description="Most replicas started under load.")
    target_ongoing_requests: float = Field(
        default=2.0, gt=0, le=1000, description="Ongoing requests per replica the autoscaler aims for."
    )
    upscale_delay_s: float = Field(default=5.0, ge=0, le=3600, description="Load must last this long before adding replicas.")
    downscale_delay_s: float = Field(default=30.0, ge=0, le=3600, description="Idle time before removing replicas.")
    metrics_interval_s: float = Field(default=2.0, gt=0, le=60, description="How often replicas report load.")
    look_back_period_s: float = Field(default=10.0, gt=0, le=600, description="Window the load is averaged over.")

    @model_validator(mode="after")
    def _check_bounds(self) -> AutoscalingOptions:
        if self.max_replicas < self.min_replicas:
            raise ValueError(
                f"autoscaling.max_replicas ({self.max_replicas}) is below min_replicas ({self.min_replicas})"
            )
        return self


REQUEST_ROUTERS = {"session_affinity": "recallserve.deployments.affinity.SessionAffinityRouter"}
"""``DeploymentOptions.request_router`` -> the class Ray Serve's ``request_router_config`` imports."""


class DeploymentOptions(StrictModel):
    """Resources and scaling of one Ray Serve deployment."""

    num_replicas: int = Field(default=1, ge=1, le=1000, description="Fixed replica count (ignored when autoscaling is set).")
    num_cpus: float = Field(default=0.25, ge=0, le=512, description="Logical CPUs reserved per replica (fractional allowed).")
    num_gpus: float = Field(default=0.0, ge=0, le=64, description="GPUs per replica; must be 0 on CPU-only profiles.")
    resources: dict[str, float] = Field(
        default_factory=dict, max_length=8,
        description="Custom Ray resources per replica (name -> amount, e.g. {recallserve_shard_slot: 1}): the replica "
                    "runs only on a node that offers them, which is how shards are spread over nodes "
                    "(deployments.local_nodes; on Kubernetes, rayStartParams.resources of a worker group).",
    )
    memory_mb: int | None = Field(default=None, ge=1, description="Memory reserved per replica in MiB (scheduling hint).")
    max_ongoing_requests: int = Field(default=16, ge=1, le=100000, description="Requests one replica accepts at once.")
    # NOTE: Ray Serve's own admission (issue 15): a caller (the HTTP proxy, or a handle) holds at
    # most this many requests waiting for a free replica slot and answers the next one at once,
    # before any replica code runs (HTTP: 503 with Retry-After). The limit is per caller, so the
    # most requests one deployment holds is replicas * max_ongoing_requests + callers * this.
    max_queued_requests: int | None = Field(
        default=None, ge=1, le=100000,
        description="Requests a caller (proxy or handle) queues for this deployment while every replica is at "
                    "max_ongoing_requests; more are refused at once (HTTP 503 + Retry-After). None = no limit.",
    )
    queue_full_retry_after_s: float = Field(
        default=1.0, ge=0, le=3600,
        description="Retry-After (seconds, rounded up) of the HTTP 503 sent when max_queued_requests is reached.",
    )
    autoscaling: AutoscalingOptions | None = Field(default=None, description="Autoscaling; None = fixed num_replicas.")
    health_check_period_s: float = Field(default=10.0, gt=0, le=600, description="Seconds between replica health checks.")
    # NOTE: 300 s matches server.request_timeout_s: a replica being replaced (a config roll-out,
    # a scale-down) finishes its in-flight requests instead of failing them. It stops as soon as
    # those are done (Serve checks every 2 s), so a long limit costs nothing when it is idle.
    graceful_shutdown_timeout_s: float = Field(
        default=300.0, ge=0, le=3600,
        description="How long a replica being stopped may finish its in-flight requests before it is killed.",
    )

    request_router: Literal["default", "session_affinity"] = Field(
        default="default",
        description="How calls pick a replica: Ray's default (power of two choices), or session_affinity (a "
                    "conversation's calls go to the replica holding its prompt prefix; for model roles with several "
                    "replicas, see deployments/affinity.py).",
    )

    # NOTE: Ray's default 0 stops an old replica before its successor starts, so a one-replica
    # deployment is gone for its start-up time on every roll-out; 100 starts the successor first.
    max_surge_percent: int = Field(
        default=0, ge=0, le=100,
        description="Extra replicas (percent of the target count, rounded up) started before old ones stop in a "
                    "roll-out; 100 = no gap even with one replica (needs room for the extra replica). Memory shards "
                    "must keep 0 (one writer per folder).",
    )

    @model_validator(mode="after")
    def _custom_resources(self) -> DeploymentOptions:
        for name, amount in self.resources.items():
            if not re.fullmatch(r"[A-Za-z][A-Za-z0-9_]{0,63}", name) or name in ("CPU", "GPU", "memory"):
                raise ValueError(f"resources: {name!r} is not a custom resource name (letters, digits, _; not CPU/GPU/memory)")
            if not 0 < amount <= 1000:
                raise ValueError(f"resources.{name}: {amount} must be in (0, 1000]")
        return self

    def to_ray_options(self) -> dict[str, Any]:
        """Options for ``Deployment.options(...)``.

        Example:
            >>> DeploymentOptions(num_cpus=0.5).to_ray_options()["ray_actor_options"]
            {'num_cpus': 0.5, 'num_gpus': 0.0}
        """
        actor: dict[str, Any] = {"num_cpus": self.num_cpus, "num_gpus": self.num_gpus}
        if self.resources:
            actor["resources"] = dict(self.resources)
        if self.memory_mb is not None:
            actor["memory"] = self.memory_mb * 1024 * 1024
        opts: dict[str, Any] = {
            "ray_actor_options": actor,
            "max_ongoing_requests": self.max_ongoing_requests,
            "health_check_period_s": self.health_check_period_s,
            "graceful_shutdown_timeout_s": self.graceful_shutdown_timeout_s,
            "max_surge_percent": self.max_surge_percent,
        }
        if self.max_queued_requests is not None:
            opts["max_queued_requests"] = self.max_queued_requests
            opts["backpressure_config"] = {"status_code": 503, "retry_after_s": self.queue_full_retry_after_s}
        if self.request_router != "default":
            opts["request_router_config"] = {"request_router_class": REQUEST_ROUTERS[self.request_router]}
        if self.autoscaling is not None:
            a = self.autoscaling
            opts["autoscaling_config"] = {
                "min_replicas": a.min_replicas,
                "max_replicas": a.max_replicas,
                "target_ongoing_requests": a.target_ongoing_requests,
                "upscale_delay_s": a.upscale_delay_s,
                "downscale_delay_s": a.downscale_delay_s,
                "metrics_interval_s": a.metrics_interval_s,
                "look_back_period_s": a.look_back_period_s,
            }
        else:
            opts["num_replicas"] = self.num_replicas
        return opts
