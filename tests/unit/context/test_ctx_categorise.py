"""Rule categoriser and the classifier hook."""

from __future__ import annotations

import pytest

from recallserve.serve.context import Categoriser, LLMClassifier, MessageIn, RuleCategoriser

from .conftest import StubEngine, run


@pytest.mark.parametrize(
    ("role", "text", "category"),
    [
        ("user", "Please never call me before 9am.", "constraint"),
        ("user", "My budget is $500 at most.", "constraint"),
        ("user", "I need it by Friday, that's the deadline.", "constraint"),
        ("user", "Don't ship to my office.", "constraint"),
        ("user", "Only use DHL for my parcels.", "constraint"),
        ("user", "My order number is ORD-123456.", "fact"),
        ("user", "My delivery address is 12 Rose Street, Leeds.", "fact"),
        ("user", "I spoke to Mrs. Amara Delacroix on 2 February.", "fact"),
        ("user", "hi there!", "greeting"),
        ("user", "Thanks a lot", "greeting"),
        ("user", "How long does shipping take?", "chat"),
        ("user", "I can't log in right now, what should I do?", "chat"),
        ("user", "Do you always ship on Sundays?", "chat"),
        ("user", "What is my order number?", "chat"),
        ("user", "Where is ORD-1234567?", "fact"),
        ("assistant", "You must restart the router first.", "chat"),
        ("assistant", "Your refund of $20.00 was issued.", "fact"),
        ("tool", '{"status": "ok"}', "tool_result"),
    ],
)
def test_rules(role: str, text: str, category: str) -> None:
    assert RuleCategoriser().categorise(role, text) == category


class _Classifier:
    def __init__(self, answer: str | None) -> None:
        self.answer = answer
        self.calls: list[str] = []

    async def classify(self, role: str, content: str) -> str | None:
        self.calls.append(content)
        return self.answer


def test_classifier_only_for_ambiguous_and_forced_wins() -> None:
    clf = _Classifier("constraint")
    cat = Categoriser(clf)
    assert run(cat.categorise(MessageIn(role="user", content="I'd rather get a call in the evening"))) == ("constraint", 2)
    assert run(cat.categorise(MessageIn(role="user", content="Never call me."))) == ("constraint", 2)
    # 003: a system constraint is the one never dropped (3); the user's instructions are 2.
    assert run(cat.categorise(MessageIn(role="system", content="Never call the customer."))) == ("constraint", 3)
    assert clf.calls == ["I'd rather get a call in the evening"]  # the rule hit did not ask the model
    # an assistant message can not become a constraint
    assert run(cat.categorise(MessageIn(role="assistant", content="Sure, evening works"))) == ("fact", 1)
    forced = MessageIn(role="user", content="whatever", category="fact", retention=3)
    assert run(cat.categorise(forced)) == ("fact", 3)
    assert run(Categoriser(_Classifier(None)).categorise(MessageIn(role="user", content="hmm ok then so"))) == ("chat", 1)


def test_llm_classifier_parses_json_and_rejects_garbage() -> None:
    engine = StubEngine(['{"category": "fact"}', "not json", '{"category": "poem"}'])
    clf = LLMClassifier(engine)
    assert run(clf.classify("user", "the blue one")) == "fact"
    assert run(clf.classify("user", "x")) is None
    assert run(clf.classify("user", "y")) is None
    assert engine.params[0].json_schema is not None and engine.params[0].temperature == 0.0
