"""Where each deployment runs on the embedded multi-node Ray (``ray.nodes`` > 1), as custom resources.

Kept free of Ray imports (profiles are validated without a cluster). Every node offers a few
custom resources and every deployment asks for some, so Ray's scheduler places them::

    head      : HEAD_RESOURCE 1,          INGRESS_SLOT 2
    worker i  : SHARD_SLOT ceil(S / W),   INGRESS_SLOT 2          (S shard deployments, W = nodes - 1 workers)

    memory shards           -> SHARD_SLOT 1      (at most ceil(S/W) per worker: with S <= W, one shard per worker,
                                                  so the shards sit on min(S, W) different nodes)
    ingress                 -> INGRESS_SLOT 1, at least 2 replicas (Serve spreads them over the nodes)
    models, embedder, state -> HEAD_RESOURCE 0.01 (on the head, which the node-loss chaos never kills)

Why the slots rather than node names: a replacement node offers the same resources, so a shard whose
node was lost is placed on it as soon as it joins, and reopens its folder (WAL + snapshot on the
host's disk). While no node has a free slot the replica waits (Serve keeps it pending). Two ingress
slots per node leave room for a roll-out's surge replica.
"""

from __future__ import annotations

import math
from collections.abc import Iterable

from recallserve.deployments.options import DeploymentOptions

__all__ = ["HEAD_RESOURCE", "INGRESS_SLOT", "SHARD_SLOT", "MIN_INGRESS_REPLICAS", "node_resources", "spread"]

HEAD_RESOURCE = "recallserve_head"
SHARD_SLOT = "recallserve_shard_slot"
INGRESS_SLOT = "recallserve_ingress_slot"
MIN_INGRESS_REPLICAS = 2
_INGRESS_SLOTS_PER_NODE = 2
_ON_HEAD = 0.01


def node_resources(head: bool, nodes: int, shard_deployments: int) -> dict[str, float]:
    """Custom resources one node offers (see the module docstring)."""
    if head:
        return {HEAD_RESOURCE: 1.0, INGRESS_SLOT: float(_INGRESS_SLOTS_PER_NODE)}
    workers = max(1, nodes - 1)
    return {SHARD_SLOT: float(math.ceil(shard_deployments / workers)), INGRESS_SLOT: float(_INGRESS_SLOTS_PER_NODE)}


def spread(opts: dict[str, DeploymentOptions], shard_names: Iterable[str]) -> dict[str, DeploymentOptions]:
    """``opts`` with each deployment's custom resources (and the ingress's replica floor) for several nodes."""
    shards = set(shard_names)
    out: dict[str, DeploymentOptions] = {}
    for name, o in opts.items():
        if name in shards:
            out[name] = o.model_copy(update={"resources": {**o.resources, SHARD_SLOT: 1.0}})
        elif name == "ingress":
            update: dict[str, object] = {"resources": {**o.resources, INGRESS_SLOT: 1.0}}
            if o.autoscaling is not None:
                if o.autoscaling.min_replicas < MIN_INGRESS_REPLICAS:
                    update["autoscaling"] = o.autoscaling.model_copy(update={
                        "min_replicas": MIN_INGRESS_REPLICAS,
                        "max_replicas": max(MIN_INGRESS_REPLICAS, o.autoscaling.max_replicas)})
            else:
                update["num_replicas"] = max(MIN_INGRESS_REPLICAS, o.num_replicas)
            out[name] = o.model_copy(update=update)
        else:
            out[name] = o.model_copy(update={"resources": {**o.resources, HEAD_RESOURCE: _ON_HEAD}})
    return out
