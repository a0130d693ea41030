"""Session affinity for model-role replicas: a conversation's calls go to the replica holding its prefix.

Each engine replica keeps the KV cache of the prompts it served (vLLM's prefix cache on GPU,
llama.cpp's live cache and saved prompt states on CPU). A conversation's next turn extends its
previous prompt, so on the replica that served it only the new tokens are evaluated; on any other
replica the whole history is evaluated again.

:class:`SessionAffinityRouter` is a Ray Serve request router (``request_router_config``; turned on
per deployment with ``deployment.request_router: session_affinity``). The pipeline marks every
engine call of a request with a hash of (tenant, session id or user)
(:func:`recallserve.serve.engine.set_engine_affinity`), passed as the ``affinity`` keyword of the call:

* with an affinity, the replicas are ranked by rendezvous hashing,
  ``rank(r) = sha256(affinity + replica id)``: the first is preferred; the rest form the second
  rank, which Ray tries when the preferred replica is at ``max_ongoing_requests`` (a busy
  conversation home spills over rather than queues). Adding or removing a replica moves only
  the conversations whose first choice it was;
* without one, two random replicas (power of two choices, Ray's default policy), of which Ray
  takes the shorter queue.
"""

from __future__ import annotations

import hashlib
import random
from collections.abc import Sequence

from ray.serve.request_router import FIFOMixin, PendingRequest, RequestRouter, RunningReplica

__all__ = ["SessionAffinityRouter", "rank_replicas"]


def rank_replicas(affinity: str, replica_ids: Sequence[str]) -> list[str]:
    """``replica_ids`` ordered by rendezvous hash with ``affinity`` (first = the conversation's home)."""
    return sorted(replica_ids, key=lambda rid: hashlib.sha256(f"{affinity}/{rid}".encode()).digest(), reverse=True)


def _affinity(pending_request: PendingRequest | None) -> str | None:
    if pending_request is None:
        return None
    value = pending_request.kwargs.get("affinity")
    return value if isinstance(value, str) and value else None


class SessionAffinityRouter(FIFOMixin, RequestRouter):
    """Route a conversation's engine calls to one replica (see the module docstring)."""

    async def choose_replicas(self, candidate_replicas: list[RunningReplica],
                              pending_request: PendingRequest | None = None) -> list[list[RunningReplica]]:
        """Ranks of replicas: the conversation's home first, then the others; or two random ones."""
        if not candidate_replicas:
            return []
        affinity = _affinity(pending_request)
        if affinity is None or len(candidate_replicas) == 1:
            return [random.sample(candidate_replicas, k=min(2, len(candidate_replicas)))]
        by_id = {r.replica_id.unique_id: r for r in candidate_replicas}
        order = rank_replicas(affinity, list(by_id))
        return [[by_id[order[0]]], [by_id[rid] for rid in order[1:]]]
