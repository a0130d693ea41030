"""Request bodies of the load test: short chat prompts, memory writes and searches.

Kept apart from the locust users so the shapes are easy to follow when the memory API (issue 4)
settles. Deterministic per RNG, so two runs with one seed send the same traffic.
"""

from __future__ import annotations

import random
from typing import Any

__all__ = ["CHAT_PROMPTS", "agent_prompts", "chat_body", "agent_chat_body", "memory_write_body",
           "memory_search_body"]

# NOTE: short prompts on purpose: on 2 CPU cores prefill dominates, and the load test measures
# the serving path (routing, batching, queues), not long generations.
CHAT_PROMPTS = (
    "Say hello in five words.",
    "What is 12 plus 30?",
    "Name one primary colour.",
    "Give me a synonym for quick.",
    "Is water wet? Answer yes or no.",
    "What day comes after Monday?",
    "Spell 'cat' backwards.",
    "Reply with the word ok.",
)
_TOPICS = ("printers/jams", "billing/refunds", "accounts/login", "shipping/delays", "hr/holidays")
_FACTS = (
    "Customer {n} prefers email over phone calls.",
    "Order {n} was delayed by the carrier for two days.",
    "Ticket {n}: the printer on floor 3 jams with thick paper.",
    "Invoice {n} was refunded on the 14th.",
    "User {n} reset their password after a lockout.",
)
_QUERIES = (
    "which printer jams",
    "refund for an invoice",
    "customer contact preference",
    "late delivery carrier",
    "password reset lockout",
)


def chat_body(rng: random.Random, model: str, max_tokens: int, *, session: tuple[str, str] | None = None) -> dict[str, Any]:
    """One OpenAI chat completion request with a short prompt.

    Args:
        session: ``(user, session_id)``: the turn continues that server-side session (only the new
            message is sent; context-mode adds the history), as a chat client with memory does.
    """
    body: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(CHAT_PROMPTS)}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
    }
    if session is not None:
        body["user"], sid = session
        body["metadata"] = {"session_id": sid}
    return body


def agent_prompts() -> list[str]:
    """Customer-service questions for the agent: the demo's tool-choice questions (80: order,
    batch, ticket, inventory, arithmetic and clock look-ups, plus small talk and manual questions)."""
    from recallserve.serve.agent.demo import load_questions

    return [q["q"] for q in load_questions("all")]


def agent_chat_body(rng: random.Random, model: str, max_tokens: int, prompts: list[str]) -> dict[str, Any]:
    """One chat turn through the agent loop (``metadata.agent = auto``: rules, tools, answer)."""
    return {
        "model": model,
        "messages": [{"role": "user", "content": rng.choice(prompts)}],
        "max_tokens": max_tokens,
        "temperature": 0.0,
        "metadata": {"agent": "auto"},
    }


def memory_write_body(rng: random.Random) -> dict[str, Any]:
    """One memory write: ``POST /v1/memories`` body (``recallserve.serve.memory_api.AddMemoriesRequest``)."""
    n = rng.randrange(1_000_000)
    return {
        "memories": [
            {
                "text": rng.choice(_FACTS).format(n=n),
                "kind": "text",
                "source_id": f"load-{n}",
                "topic": rng.choice(_TOPICS),
                "metadata": {"origin": "loadtest"},
            }
        ]
    }


def memory_search_body(rng: random.Random, k: int = 8) -> dict[str, Any]:
    """One memory search."""
    return {"query": rng.choice(_QUERIES), "k": k}
