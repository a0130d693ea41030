"""``recallserve demo [--model NAME_OR_PATH]``: run the demo question end to end in-process (no cluster).

Loads the default model with llama.cpp, an in-process memory (MiniLM + one memory shard) holding
the manual and past tickets, the demo tools, and prints the trace and the answer.
"""

from __future__ import annotations

import argparse
import json

__all__ = ["add_parser", "run"]


async def _main(model: str, threads: int) -> int:
    from recallserve.deployments.cli._eval_agent import build_llama_engine
    from recallserve.serve.agent import Agent, AgentConfig, default_registry
    from recallserve.serve.agent.demo._memory import LocalMemory
    from recallserve.serve.agent.demo.scenario import DEMO_TENANT, demo_messages, load_demo_memories
    from recallserve.serve.pipeline import agent_turn

    engine = build_llama_engine(model, threads)
    memory = LocalMemory()
    await load_demo_memories(memory)
    # NOTE: generous timeouts: the 2-core machine is often shared; the demo should finish, not give up.
    agent = Agent(engine, default_registry(), memory=memory,
                  config=AgentConfig(engine_timeout_s=900, request_timeout_s=1800))
    from recallserve.serve.agent.demo.tools import DEMO_SCOPES

    print(f"prompt cache warm-up: {await agent.warm_up(DEMO_SCOPES):.1f} s")
    # NOTE: the turn is built as for POST /v1/chat/completions (budget, images, the one recall).
    request, turn = await agent_turn(agent, demo_messages(), tenant=DEMO_TENANT, scopes=DEMO_SCOPES)
    result = await agent.run(request, turn)
    for s in result.steps:
        print(f"[{s.step}] {s.kind:12s} {s.elapsed_ms:8.0f} ms  {s.content[:220]}")
    print("\nANSWER:", result.answer)
    print(json.dumps({"finish_reason": result.finish_reason, "route": result.route.model_dump(),
                      "tool_calls": [(c.name, c.args, c.status) for c in result.tool_calls],
                      "usage": result.usage.model_dump(), "elapsed_ms": result.elapsed_ms,
                      "first_token_ms": result.first_token_ms}, indent=1))
    await engine.close()
    return 0


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``demo``."""
    from recallserve.deployments.cli._eval_agent import add_model_arguments

    p = subparsers.add_parser("demo", help="run the demo question (photo + tools) in-process and print the trace")
    add_model_arguments(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Load the model and run the demo (takes a minute or more on a CPU)."""
    from recallserve.deployments.cli._eval_agent import run_with_model

    return run_with_model(_main(args.model, args.threads))
