"""Issue 40 reproduction: run questions (one a line, file argv[1]) through the in-process agent turn on the demo world, print recall, route, calls, answer; --write stores each write-back and searches again. Loads the 1.5B model: run under the shared lock."""
import asyncio, sys, json, time
from recallserve.deployments.cli._eval_agent import build_llama_engine
from recallserve.serve.agent import Agent, AgentConfig, default_registry
from recallserve.serve.agent.demo import DEMO_SCOPES
from recallserve.serve.agent.demo._memory import LocalMemory
from recallserve.serve.agent.demo.scenario import load_demo_memories
from recallserve.serve.pipeline import agent_turn

QS = [l for l in open(sys.argv[1]).read().split("\n") if l.strip()]
WRITE = "--write" in sys.argv
async def main():
    eng = build_llama_engine("qwen2.5-coder-1.5b-instruct-q4_k_m", 2)
    m = LocalMemory(); await load_demo_memories(m)
    agent = Agent(eng, default_registry(), memory=m, config=AgentConfig(use_router=False, engine_timeout_s=300, request_timeout_s=600))
    await agent.warm_up(DEMO_SCOPES)
    for q in QS:
        t = time.time()
        req, turn = await agent_turn(agent, [{"role": "user", "content": q}], tenant="eval-user", scopes=DEMO_SCOPES)
        r = await agent.run(req, turn)
        print("=" * 80); print("Q:", q)
        print("mem:", [h["source_id"] for h in r.memory_hits])
        print("route:", r.route.route, r.route.tools, r.route.first_step)
        for c in r.tool_calls: print("call:", c.name, c.args, c.status, c.observation[:300])
        print("A:", r.answer); print(f"({time.time()-t:.0f}s)", flush=True)
        if WRITE:
            await agent.write_back("eval-user", r)
            hits = await m.search("eval-user", q, None)
            print("after write-back search:", [(h.source_id, h.kind, round(h.similarity, 3)) for h in hits[:4]])
    await eng.close()
asyncio.run(main())
