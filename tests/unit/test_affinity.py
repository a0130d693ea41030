"""Session affinity of model-role replicas (deployments/affinity.py) and its plumbing: the pipeline
marks a request's engine calls with a hash of its conversation, the handle passes it to the router."""

from __future__ import annotations

import asyncio
from collections import Counter
from types import SimpleNamespace

import pytest

pytest.importorskip("ray.serve.request_router")

from recallserve.deployments.affinity import SessionAffinityRouter, rank_replicas  # noqa: E402
from recallserve.deployments.config import load_config  # noqa: E402
from recallserve.deployments.options import REQUEST_ROUTERS, DeploymentOptions  # noqa: E402
from recallserve.serve.engine import engine_affinity, set_engine_affinity  # noqa: E402


def _replica(rid: str) -> SimpleNamespace:
    return SimpleNamespace(replica_id=SimpleNamespace(unique_id=rid))


def _choose(replicas: list[SimpleNamespace], affinity: str | None) -> list[list[str]]:
    router = SessionAffinityRouter.__new__(SessionAffinityRouter)  # NOTE: choose_replicas reads no router state
    pending = SimpleNamespace(kwargs={"affinity": affinity} if affinity else {})
    ranks = asyncio.run(router.choose_replicas(replicas, pending))  # type: ignore[arg-type]
    return [[r.replica_id.unique_id for r in rank] for rank in ranks]


def test_a_conversation_keeps_its_replica_and_conversations_spread() -> None:
    replicas = [_replica(f"r{i}") for i in range(4)]
    ranks = _choose(replicas, "conv-a")
    assert len(ranks[0]) == 1 and sorted(ranks[0] + ranks[1]) == ["r0", "r1", "r2", "r3"]
    assert all(_choose(list(reversed(replicas)), "conv-a")[0] == ranks[0] for _ in range(3))
    homes = Counter(_choose(replicas, f"conv-{i}")[0][0] for i in range(400))
    assert set(homes) == {"r0", "r1", "r2", "r3"} and min(homes.values()) > 60


def test_removing_a_replica_moves_only_its_conversations() -> None:
    ids = [f"r{i}" for i in range(4)]
    before = {f"c{i}": rank_replicas(f"c{i}", ids)[0] for i in range(200)}
    after = {c: rank_replicas(c, ids[:3])[0] for c in before}
    assert all(after[c] == home for c, home in before.items() if home != "r3")


def test_no_affinity_is_power_of_two_choices() -> None:
    replicas = [_replica(f"r{i}") for i in range(4)]
    ranks = _choose(replicas, None)
    assert len(ranks) == 1 and len(ranks[0]) == 2
    assert _choose(replicas[:1], "conv-a") == [["r0"]]


def test_affinity_is_a_hash_of_tenant_and_conversation() -> None:
    set_engine_affinity("acme", "session-1")
    a = engine_affinity.get()
    set_engine_affinity("globex", "session-1")
    assert a and engine_affinity.get() != a and "acme" not in a and len(a) == 16
    set_engine_affinity("acme", None)
    assert engine_affinity.get() is None


def test_profiles_turn_it_on_for_the_reasoner() -> None:
    opts = load_config("gpu-cluster").reasoner.deployment.to_ray_options()
    assert opts["request_router_config"] == {"request_router_class": REQUEST_ROUTERS["session_affinity"]}
    assert "request_router_config" not in DeploymentOptions().to_ray_options()
    module, _, name = REQUEST_ROUTERS["session_affinity"].rpartition(".")
    assert getattr(__import__(module, fromlist=[name]), name) is SessionAffinityRouter


class _Seen:
    """An engine that answers "ok" and keeps the affinity each call was made under."""

    model_name = "seen"
    context_window = 2048

    def __init__(self) -> None:
        self.affinities: list[str | None] = []

    async def chat(self, messages, params):  # type: ignore[no-untyped-def]
        from recallserve.serve.engine import ChatResult

        self.affinities.append(engine_affinity.get())
        return ChatResult(text="ok", prompt_tokens=3, completion_tokens=1, finish_reason="stop", model="seen")

    async def count_tokens(self, text: str) -> int:
        return len(text.split())


def test_an_http_turn_reaches_the_engine_marked_with_its_conversation() -> None:
    """Where the router reads it: the engine call of a chat request carries the hash of (tenant,
    session id or user); a request with neither carries none."""
    from fastapi.testclient import TestClient

    from recallserve.serve.api.app import create_app
    from recallserve.serve.api.auth import Authenticator
    from recallserve.serve.pipeline import ChatPipeline, PipelineSettings

    engine = _Seen()
    app = create_app(ChatPipeline(engine, PipelineSettings(model_name="m")),  # type: ignore[arg-type]
                     Authenticator({"sk-a": "acme", "sk-b": "globex"}))
    body = {"model": "m", "max_tokens": 4, "messages": [{"role": "user", "content": "hi"}]}
    with TestClient(app) as c:
        for key, extra in [("sk-a", {"user": "u1"}), ("sk-a", {"user": "u1"}), ("sk-b", {"user": "u1"}),
                           ("sk-a", {}), ("sk-a", {"user": "u2"})]:
            r = c.post("/v1/chat/completions", headers={"Authorization": f"Bearer {key}"}, json={**body, **extra})
            assert r.status_code == 200, r.text
    a1, a1_again, b1, none, a2 = engine.affinities
    set_engine_affinity("acme", "u1")
    assert a1 == a1_again == engine_affinity.get() and len({a1, b1, a2}) == 3 and none is None
