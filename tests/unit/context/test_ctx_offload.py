"""Large texts do not stall the event loop: entity scans and token counts over
``recallserve.serve.tokens.OFFLOAD_CHARS`` run in a worker thread, one entity scan serves both the rule category
and the entity table, and the token cache keys a long text by its digest."""

from __future__ import annotations

import asyncio
import threading

import pytest

from recallserve.serve.context import ContextManager, MessageIn, extract_entities
from recallserve.serve.context import _entities, _manager
from recallserve.serve.context._categorise import RuleCategoriser
from recallserve.serve.context._entities import has_entity
from recallserve.serve.tokens import OFFLOAD_CHARS, CachedCounter, TiktokenCounter, count_tokens

TEXTS = [
    "", "hello there", "Refund $249.99 for ORD-48213 by March 3.", "Do you ship on Sundays?",
    "Is order 104208 late?", "+1 " * 3000, "a@b.a@b. " * 2000, "Dr. " * 3000, "1234 " * 3000,
    "call me at +44 7970 800 2208", "the model EL-8735X and serial SN10153386", "never call me",
    "12 34 " * 900 + "Refund $5 now",
]


@pytest.mark.parametrize("text", TEXTS)
def test_has_entity_is_extract_entities_nonempty(text: str) -> None:
    assert has_entity(text) == bool(extract_entities(text))


@pytest.mark.parametrize("text", TEXTS)
@pytest.mark.parametrize("role", ["user", "assistant", "system", "tool"])
def test_rule_category_is_the_same_with_known_entities(text: str, role: str) -> None:
    rules = RuleCategoriser()
    known = bool(extract_entities(text.strip()))
    assert rules.categorise(role, text, known) == rules.categorise(role, text)


def _threads_of(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    seen: list[str] = []
    real = _manager.extract_entities

    def spy(text: str):  # type: ignore[no-untyped-def]
        seen.append(threading.current_thread().name)
        return real(text)

    monkeypatch.setattr(_manager, "extract_entities", spy)
    return seen


def _fit(manager: ContextManager, history: list[MessageIn], mode: str | None = None,  # type: ignore[no-untyped-def]
         window: int = 10_000_000):
    return asyncio.run(manager.fit(history, [MessageIn(role="user", content="and now?")],
                                   context_window=window, reserved_output=16, mode=mode))  # type: ignore[arg-type]


def test_a_large_history_is_scanned_off_the_event_loop_and_a_small_one_inline(monkeypatch: pytest.MonkeyPatch) -> None:
    seen = _threads_of(monkeypatch)
    manager = ContextManager(None)
    _fit(manager, [MessageIn(role="user", content="Refund $249.99 for ORD-48213 by March 3.")])
    assert seen == [threading.main_thread().name]
    seen.clear()
    big = "My order ORD-48213 was late. " + "x " * (OFFLOAD_CHARS // 2)
    result = _fit(manager, [MessageIn(role="user", content=big), MessageIn(role="assistant", content="Sorry!")],
                  mode="summary", window=2_000)
    assert seen and threading.main_thread().name not in seen
    # NOTE: the entity scanned in the thread reaches the prompt's memory block as before (the
    # message itself does not fit the window).
    assert "ORD-48213" in result.block


def test_one_entity_scan_per_message(monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    real = _entities._scan

    def spy(text: str, limit=None, first=False):  # type: ignore[no-untyped-def]
        if limit is not None:  # NOTE: an entity scan; masking a snippet scans without a limit
            calls.append(text)
        return real(text, limit, first)

    monkeypatch.setattr(_entities, "_scan", spy)
    manager = ContextManager(None)
    history = [MessageIn(role="user", content=f"Order ORD-4821{i} arrived cracked.") for i in range(3)]
    _fit(manager, history)
    # NOTE: one scan per history message (its entities also decide its category); the pending
    # question ("and now?") gets only the categoriser's early-exit scan.
    assert sorted(calls) == sorted([m.content for m in history] + ["and now?"])


def test_a_long_text_is_counted_in_a_worker_thread(monkeypatch: pytest.MonkeyPatch) -> None:
    import recallserve.serve.tokens as tokens

    seen: list[str] = []

    def spy(text: str) -> int:
        seen.append(threading.current_thread().name)
        return count_tokens(text)

    monkeypatch.setattr(tokens, "count_tokens", spy)
    counter = TiktokenCounter()
    assert asyncio.run(counter.count("hello world")) == 2
    assert seen == [threading.main_thread().name]
    long = "hello world " * (OFFLOAD_CHARS // 12 + 1)
    assert asyncio.run(counter.count(long)) == count_tokens(long)
    assert seen[-1] != threading.main_thread().name


def test_the_cache_keeps_a_digest_not_the_text_of_a_long_message() -> None:
    counter = CachedCounter(TiktokenCounter(), capacity=4)
    long = "word " * 20_000
    assert asyncio.run(counter.count(long)) == count_tokens(long)
    assert asyncio.run(counter.count("hi")) == 1
    keys = list(counter._cache)
    assert keys[1] == "hi"
    assert isinstance(keys[0], bytes) and len(keys[0]) == 16
    # NOTE: a hit by digest returns the cached count; another long text gets its own entry.
    assert asyncio.run(counter.count(long)) == count_tokens(long)
    other = long + "x"
    assert asyncio.run(counter.count(other)) == count_tokens(other)
    assert len(counter._cache) == 3
