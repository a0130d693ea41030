"""Prompts of the segmented-reasoning mode and the injection of past experiences.

The system prompt is a stable prefix (llama.cpp's prompt cache and vLLM's prefix cache reuse
it across requests); everything that varies (rules of the domain, retrieved experiences,
archival principles, the question) goes into the user message. Prompts are kept short on
purpose: prefill dominates latency on small CPU machines.
"""

from __future__ import annotations

from collections.abc import Sequence

from recallserve.serve.engine import ChatMessage
from recallserve.serve.experience._rules import Rule
from recallserve.serve.experience._extract import SOURCE
from recallserve.serve.experience._schema import ExperienceRecord, VerificationItem

__all__ = ["SYSTEM_PROMPT", "SYSTEM_PROMPT_JSON", "build_messages", "required_checks", "medium_warnings",
           "rewrite_messages"]

SYSTEM_PROMPT = """Solve the problem. Reply in exactly this format:
Context: <facts only>
Reasoning:
1. <step> [principle: <formula or rule>]
Verification:
- recomputation: <arithmetic with numbers only> = <value>
- unit_check: <quantities with units, like 150 km / 2.5 h> -> <unit of the answer>
- back_substitution: <equation> with <unknown> = <value>
- boundary_test: <answer number> in [<min>, <max>]
- regulatory_check: <rule id> with <variable>=<value>, ... -> <rule result>
(at least two checks that fit, each with its target; a computer runs them)
Outcome: <answer with unit>
Confidence: high|medium|low

Example:
Context: 120 km in 1.5 h
Reasoning:
1. speed = 120 / 1.5 = 80 [principle: v = d / t]
Verification:
- recomputation: 120 / 1.5 = 80
- unit_check: 120 km / 1.5 h -> km/h
- boundary_test: 80 in [0, 300]
Outcome: 80 km/h
Confidence: high"""

# NOTE: used when the reply is grammar-constrained to JSON (ExperienceConfig.constrain_json).
SYSTEM_PROMPT_JSON = """Solve the problem. Reply with one JSON object with keys in this order:
"context": {"facts": [..], "quantities": [{"name", "value", "unit"}], "constraints": [..]},
"reasoning": [{"step_id": 1, "text": "..", "principle": "formula or rule used"}],
"verification": at least two checks a computer runs, each {"type", "target", "input", "expected"} with type one of
  recomputation (target: arithmetic with numbers only, expected: its value),
  unit_check (target: quantities with units like "120 km / 1.5 h", expected: the answer's unit),
  back_substitution (target: equation like "1.5*v = 120", input: {"v": answer}),
  boundary_test (target: the answer number, input: {"min": .., "max": ..}),
  regulatory_check (target: rule id, input: the rule's variables, expected: the rule's result),
"outcome": {"answer": "number and unit", "confidence": "high|medium|low", "explanation": ".."}"""


def _own(rec: ExperienceRecord) -> list[VerificationItem]:
    """The checks the model wrote (not those derived from the context, which code adds itself)."""
    return [v for v in rec.verification if v.input.get("source") != SOURCE]


def _held(v: VerificationItem) -> bool:
    """A check that held: passed when code ran it, or, unverified, stated as passed by its author
    (a reviewer-approved record of the design's shape, whose rule code does not hold)."""
    return v.status == "pass" or (not v.verified and v.stated is not None and v.stated.status == "pass")


def required_checks(experiences: Sequence[ExperienceRecord]) -> list[str]:
    """Check types the injected experiences imply: every type the model wrote that held in one of them."""
    out: list[str] = []
    for rec in experiences:
        for v in _own(rec):
            if _held(v) and v.type not in out:
                out.append(v.type)
    return out


def _required_line(experiences: Sequence[ExperienceRecord], required: Sequence[str]) -> str:
    """002's verification constraint: each required check type, with the rule ids it was run on.

    Only a ``regulatory_check``'s target (a rule id) carries over to a new problem; the other
    types' targets are the old problem's expressions, so they are named without one.
    """
    targets: dict[str, list[str]] = {}
    for rec in experiences:
        for v in _own(rec):
            if v.type == "regulatory_check" and _held(v) and v.target and v.target not in targets.setdefault(v.type, []):
                targets[v.type].append(v.target[:64])
    named = [f"{t} (target {', '.join(targets[t][:3])})" if targets.get(t) else t for t in required]
    return f"Your verification must include: {', '.join(named)}."


def medium_warnings(experiences: Sequence[ExperienceRecord]) -> list[str]:
    """002's warning for an injected experience of Medium confidence: which of its checks code could
    not confirm, so the reasoner verifies them itself and a person reviews the answer."""
    out = []
    for i, rec in enumerate(experiences, start=1):
        if rec.outcome.confidence != "medium":
            continue
        doubtful = [f"{v.type} {v.target[:64]}".strip() + (f" ({(v.stated.notes if v.stated and v.stated.notes else v.notes)[:120]})"
                                                            if (v.stated and v.stated.notes) or v.notes else "")
                    for v in _own(rec) if v.status != "pass"][:3]
        what = "; ".join(doubtful) if doubtful else "no check computed its answer"
        out.append(f"Warning: past problem {i} is only Medium confidence: {what}. Check this yourself; "
                   "the answer will be reviewed by a person.")
    return out


def _experience_block(rec: ExperienceRecord) -> str:
    steps = "; ".join(
        (f"{s.text} ({s.principle})" if s.principle else s.text) for s in rec.reasoning[:4]
    )
    checks = "; ".join(f"{v.type}: {v.target}" for v in _own(rec) if v.status == "pass")[:300]
    return f"- Problem: {rec.context.raw_text[:200]}\n  Key reasoning: {steps[:300]}\n  Checks: {checks}\n  Answer: {rec.outcome.answer_text}"


def _archival_block(rec: ExperienceRecord) -> str:
    principles = "; ".join(s.principle for s in rec.reasoning if s.principle)[:200]
    if rec.evaluation.human_label == "wrong":
        tags = ", ".join(rec.evaluation.error_tags) or "unspecified error"
        note = f" ({rec.evaluation.review_note[:120]})" if rec.evaluation.review_note else ""
        return f"- Avoid ({tags}){note}: a past answer '{rec.outcome.answer_text[:60]}' was wrong."
    return f"- Principle: {principles or rec.outcome.explanation[:200]}"


def build_messages(
    question: str,
    *,
    experiences: Sequence[ExperienceRecord] = (),
    archival: Sequence[ExperienceRecord] = (),
    rules: Sequence[Rule] = (),
    json_mode: bool = False,
) -> tuple[list[ChatMessage], list[str]]:
    """Messages for the reasoner and the check types the answer is required to contain.

    Args:
        question: The problem.
        experiences: Active-cache experiences to show (key reasoning and passed checks).
        archival: Archival records of the topic: their principles, or the errors to avoid.
        rules: Registered rules the model may cite in ``regulatory_check`` items.
        json_mode: Ask for a JSON object (for grammar-constrained replies) instead of the
            shorter line format (about half the tokens to generate).

    Returns:
        ``(messages, required)`` where ``required`` lists the check types implied by the
        injected experiences (enforced by :func:`~._verify.verify_record`).
    """
    parts: list[str] = []
    if rules:
        parts.append("Rules (cite the id in regulatory_check):\n" + "\n".join(
            f"- {r.id}: {r.description} [variables: {', '.join(r.variables)}]" for r in rules))
    required = required_checks(experiences)
    if experiences:
        parts.append("Past solved problems:\n" + "\n".join(_experience_block(r) for r in experiences))
    if archival:
        parts.append("Lessons:\n" + "\n".join(_archival_block(r) for r in archival))
    if required:
        parts.append(_required_line(experiences, required))
    parts.extend(medium_warnings(experiences))
    parts.append(f"Problem: {question}")
    system = SYSTEM_PROMPT_JSON if json_mode else SYSTEM_PROMPT
    return [ChatMessage(role="system", content=system), ChatMessage(role="user", content="\n\n".join(parts))], required


# NOTE: the rewrite keeps the reasoner's content; the router model only reformats it.
_REWRITE = ("Rewrite the reply below into the format. Keep its facts, steps, numbers and answer exactly; "
            "add nothing. Reply with the rewritten text only.\n\nReply:\n")
_MAX_REWRITE_CHARS = 6000


def rewrite_messages(reply: str, json_mode: bool = False) -> list[ChatMessage]:
    """Messages asking a light model to put an unparsable ``reply`` into the segmented format
    (the reply is cut at 6000 characters: the reasoner's budget is a few hundred tokens)."""
    system = SYSTEM_PROMPT_JSON if json_mode else SYSTEM_PROMPT
    return [ChatMessage(role="system", content=system),
            ChatMessage(role="user", content=_REWRITE + reply[:_MAX_REWRITE_CHARS])]
