"""Issue 37 part B without a cluster: the multi-node placement, its config checks, `status` rendering, the chaos report."""

from __future__ import annotations

import pytest

from recallserve.deployments._node_placement import HEAD_RESOURCE, INGRESS_SLOT, SHARD_SLOT, node_resources
from recallserve.deployments.config import ConfigError, load_config
from recallserve.deployments.options import DeploymentOptions


def _nodes(n: int, **ray: object) -> object:
    return load_config("cpu-local", overrides={"ray": {"nodes": n, "ingress": "proxy", **ray}})


def test_several_nodes_spread_shards_and_keep_two_ingress_replicas() -> None:
    opts = _nodes(3).deployment_options()
    shards = [n for n in opts if n.startswith("memory_shard_")]
    assert len(shards) == 2 and all(opts[n].resources == {SHARD_SLOT: 1.0} for n in shards)
    assert opts["ingress"].num_replicas >= 2 and opts["ingress"].resources == {INGRESS_SLOT: 1.0}
    assert {n for n, o in opts.items() if HEAD_RESOURCE in o.resources} == {"state", "embedder", "reasoner"}
    ray_opts = opts["memory_shard_0"].to_ray_options()["ray_actor_options"]
    assert ray_opts["resources"] == {SHARD_SLOT: 1.0}
    # NOTE: two workers with one shard slot each hold two shards on two different nodes.
    workers = [node_resources(False, 3, len(shards)) for _ in range(2)]
    assert [w[SHARD_SLOT] for w in workers] == [1.0, 1.0]
    assert HEAD_RESOURCE in node_resources(True, 3, 2) and SHARD_SLOT not in node_resources(True, 3, 2)


def test_one_node_is_unchanged() -> None:
    one = load_config("cpu-local").deployment_options()
    assert all(not o.resources for o in one.values()) and one["ingress"].num_replicas == 1


def test_autoscaled_ingress_gets_the_floor_of_two() -> None:
    cfg = load_config("cpu-local", overrides={"ray": {"nodes": 2, "ingress": "proxy"},
                                               "ingress": {"autoscaling": {"min_replicas": 1, "max_replicas": 1}}})
    a = cfg.deployment_options()["ingress"].autoscaling
    assert a is not None and (a.min_replicas, a.max_replicas) == (2, 2)


@pytest.mark.parametrize(("ray", "message"), [
    ({"nodes": 3}, "ray.ingress: proxy"),  # the profile's HAProxy ingress binds the one host address
    ({"redis_address": "127.0.0.1:6379"}, "ray.redis_address"),
    ({"nodes": 3, "ingress": "proxy", "redis_address": "not an address"}, "redis_address"),
    ({"nodes": 9, "ingress": "proxy"}, "ray.nodes"),
])
def test_bad_node_settings_name_the_field(ray: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        load_config("cpu-local", overrides={"ray": ray})


@pytest.mark.parametrize("resources", [{"CPU": 1.0}, {"bad name": 1.0}, {"ok_name": 0.0}])
def test_custom_resources_are_checked(resources: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="resources"):
        DeploymentOptions(resources=resources)


def test_up_and_status_take_their_arguments() -> None:
    from recallserve.deployments.cli import build_parser

    args = build_parser().parse_args(["up", "--nodes", "3", "--redis-address", "127.0.0.1:6390"])
    assert (args.nodes, args.redis_address) == (3, "127.0.0.1:6390")
    assert build_parser().parse_args(["status", "--json"]).json is True


def test_status_table_lists_nodes_and_replicas() -> None:
    from recallserve.deployments.cluster_status import render_status

    text = render_status({
        "nodes": [{"node_id": "a" * 56, "role": "head", "address": "10.0.0.1", "raylet_pid": 11, "alive": True,
                   "resources": {HEAD_RESOURCE: 1.0}},
                  {"node_id": "b" * 56, "role": "worker", "address": "10.0.0.1", "raylet_pid": None, "alive": False,
                   "resources": {}}],
        "replicas": [{"app": "recallserve", "deployment": "memory_shard_0", "replica": "x1", "node_id": "b" * 56,
                      "pid": 42, "state": "ALIVE"}]})
    lines = text.splitlines()
    assert lines[1].split()[:4] == ["a" * 12, "head", "11", "yes"]
    assert lines[2].split()[:4] == ["b" * 12, "worker", "-", "no"]
    assert lines[-1].split() == ["recallserve", "memory_shard_0", "x1", "b" * 12, "42", "ALIVE"]


def test_chaos_helpers() -> None:
    from loadtests import node_chaos as nc

    a, b = nc.pick_tenants(2)
    assert nc.home_shard(a, 2) != nc.home_shard(b, 2)
    assert [nc.classify(503, True), nc.classify(500, False), nc.classify(-1, False), nc.classify(503, False)] == \
        ["fast_503", "proxy_500", "timeout", "other_503"]
    recs = [{"tenant": a, "t0": 1.0, "ok": True}, {"tenant": a, "t0": 2.0, "ok": False}, {"tenant": b, "t0": 1.5, "ok": False},
            {"tenant": a, "t0": 9.0, "ok": False}]
    assert nc.outage_success(recs, a, 0.5, 3.0) == (1, 2)
    with pytest.raises(SystemExit):
        nc.parse_args(["--kills", "0"])


def test_outage_requests_count_by_start_time() -> None:
    from loadtests import node_chaos as nc

    recs = [{"t0": 1.0, "kind": "turn", "ok": True}, {"t0": 5.0, "kind": "turn", "ok": False},
            {"t0": 6.0, "kind": "write", "ok": True}, {"t0": 11.0, "kind": "write", "ok": False}]
    assert nc.outage_requests(recs, 4.0, 10.0) == {
        "ok": 1, "requests": 2, "by_kind": {"turn": {"ok": 0, "requests": 1}, "write": {"ok": 1, "requests": 1}}}
