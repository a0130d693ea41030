"""``recallserve eval agent``: tool-choice accuracy and loop latency of the agent with a real model."""

from __future__ import annotations

import argparse

__all__ = ["add_parser", "run"]


def add_parser(subparsers: argparse._SubParsersAction) -> None:  # type: ignore[type-arg]
    """Register ``eval agent``."""
    from serve.agent.eval import build_parser

    p = subparsers.add_parser("agent", help="tool-choice accuracy of the agent on the demo questions")
    build_parser(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the evaluation (loads the model: takes minutes on a CPU)."""
    import asyncio

    from serve.agent.eval import _amain
    from serve.cli import UserError
    from serve.engine import EngineError

    try:
        return asyncio.run(_amain(args))
    except EngineError as exc:
        raise UserError(f"model: {exc}") from None
