"""Issue 40 reproduction: the in-process agent turn on the demo world, question by question.

``python loadtests/issue40_repro.py QUESTIONS.txt [--write]``: one question a line; prints the
turn's recall, route, tool calls and answer; with ``--write`` each answer's write-back is stored and
the same question searched again (source id, kind, cosine in the service's order). Loads the 1.5B
model: run it under the shared lock. Output on main: ``results/issue40-repro-main.txt``.
"""

from __future__ import annotations

import asyncio
import sys
import time

from recallserve.deployments.cli._eval_agent import build_llama_engine
from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.agent.demo import DEMO_SCOPES
from recallserve.serve.agent.demo._memory import LocalMemory
from recallserve.serve.agent.demo.scenario import load_demo_memories
from recallserve.serve.pipeline import agent_turn


async def main(path: str, write: bool) -> None:
    questions = [line for line in open(path, encoding="utf-8").read().splitlines() if line.strip()]
    engine = build_llama_engine("qwen2.5-coder-1.5b-instruct-q4_k_m", 2)
    memory = LocalMemory()
    await load_demo_memories(memory)
    agent = Agent(engine, default_registry(), memory=memory,
                  config=AgentConfig(use_router=False, engine_timeout_s=300, request_timeout_s=600))
    await agent.warm_up(DEMO_SCOPES)
    for q in questions:
        t = time.time()
        request, turn = await agent_turn(agent, [{"role": "user", "content": q}], tenant="eval-user", scopes=DEMO_SCOPES)
        r = await agent.run(request, turn)
        print("=" * 80, "\nQ:", q)
        print("mem:", [h["source_id"] for h in r.memory_hits])
        print("route:", r.route.route, r.route.tools, r.route.first_step)
        for c in r.tool_calls:
            print("call:", c.name, c.args, c.status, c.observation[:300])
        print("A:", r.answer, f"\n({time.time() - t:.0f}s)", flush=True)
        if write:
            await agent.write_back("eval-user", r)
            hits = await memory.search("eval-user", q, None)
            print("after write-back search:", [(h.source_id, h.kind, round(h.similarity, 3)) for h in hits[:4]])
    await engine.close()


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], "--write" in sys.argv))
