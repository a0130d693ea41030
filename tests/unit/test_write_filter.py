"""The chat write filter: statements, decisions and outcomes are stored; greetings and questions are not."""

from __future__ import annotations

import pytest

from recallserve.serve.write_filter import WriteFilterConfig, worth_storing


@pytest.mark.parametrize("question, answer", [
    ("Hi!", "Hello! How can I help?"),
    ("Thanks, that is great!", "You are welcome."),
    ("ok", "ok"),
    ("What is the refund policy for orders?", "Refunds are processed within 5 days; keep the order number."),
    ("Hello. Can you remind me how to reset the router?", "Hold the reset button for ten seconds."),
])
def test_small_talk_and_questions_are_not_stored(question: str, answer: str) -> None:
    assert worth_storing(question, answer) is None


@pytest.mark.parametrize("question, answer, kept", [
    ("I live in Lisbon and work as a night nurse.", "Nice!", "I live in Lisbon and work as a night nurse."),
    ("Hi! My order 4411 arrived damaged, the screen is cracked.", "Sorry about that.",
     "My order 4411 arrived damaged, the screen is cracked."),
    ("I decided to go with the annual plan.", "Great choice.", "I decided to go with the annual plan."),
    ("Please cancel my subscription.", "Done: I cancelled it today.", "Please cancel my subscription."),
])
def test_statements_decisions_and_outcomes_are_stored(question: str, answer: str, kept: str) -> None:
    text = worth_storing(question, answer)
    assert text == f"user: {kept}\nassistant: {answer}"


def test_mode_all_stores_every_exchange() -> None:
    assert worth_storing("Hi!", "Hello!", WriteFilterConfig(mode="all")) == "user: Hi!\nassistant: Hello!"
    strict = WriteFilterConfig(min_content_words=6)
    assert worth_storing("I live in Lisbon.", "Nice!", strict) is None
