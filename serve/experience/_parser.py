"""Tolerant parsing of a reasoner's segmented output into experience segments.

Small models rarely follow a format exactly, so four layouts are tried in order:

1. **json**: a JSON object (bare, fenced, embedded in prose, or repaired with ``json_repair``)
   with keys ``context``/``reasoning``/``verification``/``outcome`` (aliases accepted);
2. **separators**: sections split by ``---`` lines, named by their first line or by position;
3. **headings**: numbered or markdown headings (``1. Context``, ``## Reasoning``, ``**Outcome**``);
4. **keywords**: fallback splitting wherever ``Context:``/``Reasoning:``/``Verification:``/
   ``Answer:`` appear, even inline.

Chinese replies (the design source's language, issue 39) are read by the same layouts with Chinese
names: 上下文 / 已知 / 背景 (context), 推理 / 推理过程 / 步骤 (reasoning), 验证 / 校验 (verification),
结论 / 答案 / 最终答案 (outcome), with a full-width colon, numbered steps as ``1、`` or ``第1步``.
A Chinese reply with no labels at all falls back to its sentences' opening words
(:func:`_split_zh_sentences`): 根据 / 由于 / 因为 start reasoning, 验证 / 检验 / 代入 start a check,
and the last sentence opened by 综上 / 因此 / 所以 / 结论 / 答案是 is the outcome.

Whatever cannot be read is listed in :attr:`ParseReport.problems` rather than dropped silently.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any, Literal

from pydantic import Field, ValidationError

from recallserve.kernels import StrictModel
from recallserve.serve.experience._schema import (
    ExperienceContext,
    ExperienceMetadata,
    ExperienceOutcome,
    ExperienceRecord,
    Quantity,
    ReasoningStep,
    StatedResult,
    StructuredConstraint,
    VerificationItem,
    answer_text,
)

__all__ = ["ParseReport", "ParsedTrace", "parse_segmented", "parse_verification_line"]

SEGMENTS = ("context", "reasoning", "verification", "outcome")
_ALIASES = {
    "context": "context", "facts": "context", "given": "context", "problem": "context",
    "reasoning": "reasoning", "steps": "reasoning", "reasoning_steps": "reasoning", "solution": "reasoning",
    "verification": "verification", "verifications": "verification", "checks": "verification",
    "verify": "verification", "check": "verification",
    "outcome": "outcome", "answer": "outcome", "result": "outcome", "final": "outcome", "final_answer": "outcome",
    "上下文": "context", "背景": "context", "已知": "context", "已知条件": "context", "题目": "context",
    "推理": "reasoning", "推理过程": "reasoning", "步骤": "reasoning", "解题步骤": "reasoning", "分析": "reasoning",
    "验证": "verification", "校验": "verification", "检验": "verification", "核验": "verification",
    "结论": "outcome", "答案": "outcome", "最终答案": "outcome", "结果": "outcome",
}
_KW = (r"context|facts|given|reasoning|steps|solution|verification|verifications|checks|verify|outcome|final answer|answer|result"
       r"|上下文|背景|已知条件|已知|题目|推理过程|推理|解题步骤|步骤|分析|验证|校验|检验|核验|结论|最终答案|答案|结果")
_HEADING = re.compile(
    rf"^\s*(?:#{{1,6}}\s*)?(?:\*\*|__)?\s*(?:(?:step\s+)?\d+\s*[.):]\s*)?(?:\*\*|__)?\s*({_KW})\b\s*(?:\*\*|__)?\s*[:：]?\s*(?:\*\*|__)?\s*(.*)$",
    re.IGNORECASE,
)
_INLINE = re.compile(rf"(?<![\w])({_KW})\s*[:：]", re.IGNORECASE)
_SEPARATOR = re.compile(r"^\s*(?:-{3,}|={3,}|\*{3,})\s*$", re.MULTILINE)
_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)
_TYPE_WORDS: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"back[\s_-]*substitut|substitut|plug|代入|回代", re.I), "back_substitution"),
    (re.compile(r"unit|dimension|单位|量纲", re.I), "unit_check"),
    (re.compile(r"boundar|bound|range|limit|sanity|边界|范围|上限|下限|阈值", re.I), "boundary_test"),
    (re.compile(r"rule|regulat|complian|policy|规则|法规|合规|条款|规定|办法", re.I), "regulatory_check"),
    (re.compile(r"recomput|recalcul|calculat|arithmetic|comput|重算|复算|重新计算|计算", re.I), "recomputation"),
]


class ParseReport(StrictModel):
    """What the parser found and what it could not read."""

    format: Literal["json", "separators", "headings", "keywords", "none"] = Field(description="Layout recognised.")
    found: list[str] = Field(default_factory=list, description="Segments found.")
    problems: list[str] = Field(default_factory=list, description="Parts that could not be parsed.")
    ok: bool = Field(description="All four segments present and an answer found.")


@dataclass
class ParsedTrace:
    """Segments read from a reply; turn them into a record with :meth:`to_record`."""

    report: ParseReport
    facts: list[str] = field(default_factory=list)
    quantities: list[Quantity] = field(default_factory=list)
    constraints: list[str | StructuredConstraint] = field(default_factory=list)
    reasoning: list[ReasoningStep] = field(default_factory=list)
    verification: list[VerificationItem] = field(default_factory=list)
    answer: str | None = None
    confidence: str | None = None
    explanation: str = ""

    def to_record(self, question: str, metadata: ExperienceMetadata) -> ExperienceRecord:
        """Build a record; the context raw text is the question (facts come from the caller).

        Raises:
            ValueError: when no answer was found (the caller reports it as a parse failure).
        """
        if not self.answer:
            raise ValueError("no answer found in the reply")
        conf = self.confidence if self.confidence in ("high", "medium", "low") else None
        return ExperienceRecord(
            metadata=metadata,
            context=ExperienceContext(raw_text=question, quantities=self.quantities, constraints=self.constraints),
            reasoning=self.reasoning,
            verification=self.verification,
            outcome=ExperienceOutcome(answer=self.answer[:2000], stated_confidence=conf, explanation=self.explanation[:2000]),  # type: ignore[arg-type]
        )


def _canon_key(key: str) -> str | None:
    return _ALIASES.get(re.sub(r"[\s-]+", "_", key.strip().lower()))


def _load_json(text: str) -> Any:
    """First JSON object in ``text`` (fenced, bare or embedded), repaired if needed; else None."""
    candidates = [m.group(1) for m in _FENCE.finditer(text)] + [text]
    for cand in candidates:
        start, end = cand.find("{"), cand.rfind("}")
        for chunk in ([cand[start:end + 1]] if 0 <= start < end else []) + [cand]:
            try:
                obj = json.loads(chunk)
            except json.JSONDecodeError:
                continue
            if isinstance(obj, dict):
                return obj
    if "{" not in text:
        return None
    try:
        import json_repair  # noqa: PLC0415 - optional at import time; a runtime dependency
    except ImportError:  # pragma: no cover - json-repair is a declared dependency
        return None
    obj = json_repair.loads(text[text.find("{"):])
    return obj if isinstance(obj, dict) and obj else None


def _str(x: Any) -> str:
    if x is None:
        return ""
    if isinstance(x, str):
        return x.strip()
    return json.dumps(x) if isinstance(x, (dict, list)) else str(x)


def _lines(text: str) -> list[str]:
    out = []
    for raw in text.splitlines():
        line = re.sub(r"^\s*(?:[-*•]|\d+[.)])\s+", "", raw).strip()
        if line:
            out.append(line)
    return out


# ---------------------------------------------------------------- segment readers


def _read_quantities(x: Any, trace: ParsedTrace) -> None:
    items: list[Any] = list(x.items()) if isinstance(x, dict) else list(x) if isinstance(x, list) else []
    for it in items:
        try:
            if isinstance(it, tuple):
                name, val = it
                m = re.match(r"^\s*([-+]?\d[\d,]*(?:\.\d+)?)\s*(.*)$", _str(val))
                if not m:
                    raise ValueError(f"value {val!r} is not a number")
                q = Quantity(name=str(name)[:64], value=float(m.group(1).replace(",", "")), unit=m.group(2)[:32])
            elif isinstance(it, dict):
                q = Quantity(name=_str(it.get("name"))[:64], value=float(str(it.get("value")).replace(",", "")),
                             unit=_str(it.get("unit"))[:32])
            else:
                raise ValueError(f"{it!r} is not a quantity")
            trace.quantities.append(q)
        except (ValueError, TypeError, ValidationError) as exc:
            trace.report.problems.append(f"context.quantities: {str(exc).splitlines()[0]}")


_QTY_TEXT = re.compile(r"([A-Za-z_][A-Za-z0-9_ ]{0,30}?)\s*[=:]\s*([-+]?\d[\d,]*(?:\.\d+)?)\s*([A-Za-z/^]*\d?)")


def _read_context(x: Any, trace: ParsedTrace) -> None:
    if isinstance(x, dict):
        facts = x.get("facts", x.get("raw_text", x.get("text", [])))
        trace.facts.extend(_lines(facts) if isinstance(facts, str) else [_str(f) for f in facts or []])
        # NOTE: the design's record keeps quantities and constraints under context.structured.
        nested = x.get("structured") if isinstance(x.get("structured"), dict) else {}
        _read_quantities(nested.get("quantities", x.get("quantities", [])), trace)
        cons = nested.get("constraints", x.get("constraints", []))
        if isinstance(cons, str):
            trace.constraints.extend(_lines(cons))
        elif isinstance(cons, list):
            for c in cons[:32]:
                trace.constraints.append(_constraint(c))
        return
    lines = _lines(x) if isinstance(x, str) else [_str(v) for v in x] if isinstance(x, list) else []
    for line in lines:
        trace.facts.append(line)
        for name, val, unit in _QTY_TEXT.findall(line):
            key = re.sub(r"\s+", "_", name.strip().lower())
            if key.isidentifier():
                trace.quantities.append(Quantity(name=key[:64], value=float(val.replace(",", "")), unit=unit[:32]))
        if re.search(r"\b(must|at most|at least|no more than|cannot|only if|<=|>=)\b|不得|不超过|不能超过|必须|至少|最多|不低于|不高于", line, re.I):
            trace.constraints.append(line[:500])


def _constraint(c: Any) -> str | StructuredConstraint:
    """A written constraint: the design's object ({regulation, threshold, ...}) when it reads as one,
    else its text."""
    if isinstance(c, dict):
        try:
            return StructuredConstraint.model_validate(c)
        except ValidationError:
            pass
    return _str(c)[:500] or "?"


_STEP = re.compile(r"^\s*(?:step\s*|第)?(\d+)\s*(?:步\s*[:：、.]?|[.):\-、．）：])\s*(.*)$", re.I)
_LABELLED = re.compile(r"\b(principle|rule|formula|evidence|because)\s*[:=]\s*(.*)$", re.I)


def _read_reasoning(x: Any, trace: ParsedTrace) -> None:
    if isinstance(x, list):
        for i, it in enumerate(x, start=1):
            try:
                if isinstance(it, dict):
                    text = _str(it.get("text") or it.get("description") or it.get("content") or it.get("step"))
                    sid = it.get("step_id", it.get("id", i))
                    step = ReasoningStep(step_id=int(sid) if str(sid).isdigit() else i, text=text[:2000],
                                         principle=_str(it.get("principle") or it.get("formula"))[:500],
                                         evidence=_str(it.get("evidence"))[:1000])
                else:
                    step = ReasoningStep(step_id=i, text=_str(it)[:2000])
                trace.reasoning.append(step)
            except (ValueError, TypeError, ValidationError) as exc:
                trace.report.problems.append(f"reasoning[{i}]: {str(exc).splitlines()[0]}")
        return
    raw = x if isinstance(x, str) else _str(x)
    for raw_line in raw.splitlines():
        line = raw_line.strip().lstrip("-*• ").strip()
        if not line:
            continue
        lab = _LABELLED.search(line)
        m = _STEP.match(line)
        if trace.reasoning and lab and lab.start() == 0:
            prev = trace.reasoning[-1]
            key = "evidence" if lab.group(1).lower() in ("evidence", "because") else "principle"
            trace.reasoning[-1] = prev.model_copy(update={key: lab.group(2)[:500]})
            continue
        text = (m.group(2) if m else line)[:2000]
        principle = ""
        if lab and lab.start() > 0:
            principle, text = lab.group(2).strip(" )]")[:500], text[: text.lower().find(lab.group(1).lower())].strip(" ([;,") or text
        if text:
            trace.reasoning.append(ReasoningStep(step_id=len(trace.reasoning) + 1, text=text, principle=principle))


def _type_of(label: str) -> str | None:
    for pat, typ in _TYPE_WORDS:
        if pat.search(label):
            return typ
    return None


def parse_verification_line(line: str) -> VerificationItem | None:
    """Read one written check such as ``"unit_check: 120 km / 1.5 h -> km/h"``; None if no type."""
    line = re.sub(r"\s*(?:[(\[]?\s*(?:pass(?:ed)?|ok|✓|✔|correct)\s*[)\]]?\.?)\s*$", "", line.strip(), flags=re.I)
    label, sep, rest = line.replace("：", ":", 1).partition(":")
    typ = _type_of(label) if sep else None
    if typ is None:
        typ, rest = _type_of(line), line
        if typ is None:
            return None
        rest = re.sub(r"^\s*\w+[\s_-]*\w*\s*", "", rest) if _type_of(rest.split(" ")[0]) else rest
    body, expected = rest.strip(), None
    arrow = re.split(r"\s*(?:->|=>|→|\bexpected\b:?|\bshould be\b)\s*", body, maxsplit=1, flags=re.I)
    if len(arrow) == 2:
        body, expected = arrow[0].strip(), arrow[1].strip()
    inputs: dict[str, Any] = {}
    with_part = re.split(r"\s+(?:with|where|for|using)\s+", body, maxsplit=1, flags=re.I)
    if len(with_part) == 2:
        body = with_part[0].strip()
        for k, v in re.findall(r"([A-Za-z_]\w*)\s*=\s*([-+]?\d[\d,]*(?:\.\d+)?)", with_part[1]):
            inputs[k] = float(v.replace(",", ""))
    if typ == "boundary_test" and expected is None:
        m = re.match(r"^(.*?)\s+(?:in|within|is in)\s+(.+)$", body, re.I)
        if m:
            body, expected = m.group(1).strip(), m.group(2).strip()
    return VerificationItem(type=typ, target=body[:1000], input=inputs, expected=expected)  # type: ignore[arg-type]


def _read_verification(x: Any, trace: ParsedTrace) -> None:
    items = x if isinstance(x, list) else _lines(x) if isinstance(x, str) else [x] if isinstance(x, dict) else []
    for i, it in enumerate(items, start=1):
        try:
            if isinstance(it, dict):
                typ = _type_of(_str(it.get("type") or it.get("check") or it.get("kind")))
                if typ is None:
                    raise ValueError(f"unknown check type {it.get('type')!r}")
                target = it.get("target", it.get("expression", it.get("equation", it.get("rule", ""))))
                raw_input = it.get("input", it.get("inputs", {}))
                # NOTE: the design's shape (a regulatory_check with target and notes, a boundary_test
                # with input / expected / actual and a status): the written result is kept as stated;
                # code still runs the check and its verdict is the status.
                stated = None
                if any(k in it for k in ("status", "actual", "notes")):
                    st = _str(it.get("status")).lower()
                    stated = StatedResult(status=st if st in ("pass", "fail", "doubtful", "not_run") else None,
                                          actual=it.get("actual") if isinstance(it.get("actual"), (int, float, str, bool))
                                          or it.get("actual") is None else _str(it.get("actual"))[:1000],
                                          notes=_str(it.get("notes"))[:1000] or None)
                item = VerificationItem(type=typ, target=_str(target)[:1000],  # type: ignore[arg-type]
                                        input=raw_input if isinstance(raw_input, dict) else {"value": raw_input},
                                        expected=it.get("expected"), stated=stated)
            else:
                parsed = parse_verification_line(_str(it))
                if parsed is None:
                    raise ValueError(f"no check type in {_str(it)[:60]!r}")
                item = parsed
            trace.verification.append(item)
        except (ValueError, TypeError, ValidationError) as exc:
            trace.report.problems.append(f"verification[{i}]: {str(exc).splitlines()[0]}")


_OUTCOME_KEYS = {"答案": "answer", "答案是": "answer", "最终答案": "answer", "结论": "answer", "置信度": "confidence",
                 "解释": "explanation", "说明": "explanation"}


def _read_outcome(x: Any, trace: ParsedTrace) -> None:
    if isinstance(x, dict):
        raw = next((x[k] for k in ("answer", "final_answer", "result", "value") if x.get(k) not in (None, "")), None)
        # NOTE: an atomic answer may be a JSON boolean or number (the design's "answer": true).
        trace.answer = (answer_text(raw) if isinstance(raw, (bool, int, float)) else _str(raw)) or None
        trace.confidence = _str(x.get("confidence")).lower() or None
        trace.explanation = _str(x.get("explanation"))
        return
    text = _str(x)
    inline = re.search(r"[\[(]?\s*confidence\s*[:=]\s*(high|medium|low)\s*[\])]?", text, re.I)
    if inline and not re.match(r"^\s*confidence", text[: inline.end()].splitlines()[-1], re.I):
        # NOTE: "80 km/h [confidence: high]" on one line: take the confidence out of the answer.
        trace.confidence = inline.group(1).lower()
        text = text[: inline.start()] + text[inline.end():]
    for line in _lines(text):
        m = re.match(r"^(answer|final answer|result|confidence|explanation|答案是?|最终答案|结论|置信度|解释|说明)\s*[:=：]?\s*(.*)$", line, re.I)
        key, val = (_OUTCOME_KEYS.get(m.group(1).lower(), m.group(1).lower()), m.group(2).strip()) if m else ("", line)
        if key == "confidence":
            c = re.search(r"high|medium|low|高|中|低", val, re.I)
            trace.confidence = {"高": "high", "中": "medium", "低": "low"}.get(c.group(0), c.group(0).lower()) if c else None
        elif key == "explanation":
            trace.explanation = val
        elif not trace.answer:
            trace.answer = val.strip("*` ") or None
        else:
            trace.explanation = (trace.explanation + " " + val).strip()


_READERS = {"context": _read_context, "reasoning": _read_reasoning,
            "verification": _read_verification, "outcome": _read_outcome}


# ---------------------------------------------------------------- layouts


def _split_headings(text: str) -> list[tuple[str, str]]:
    sections: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        m = _HEADING.match(line)
        # NOTE: a keyword opening an ordinary sentence ("1. Given the speed ...") is no heading:
        # require a colon after the keyword or the keyword alone on its line (markers allowed).
        if m and len(line) < 200 and (
            not m.group(2).strip().strip("*_:")
            or re.search(rf"{re.escape(m.group(1))}\s*(?:\*\*|__)?\s*[:：]", line, re.I)
        ):
            sections.append((_ALIASES[re.sub(r"\s+", "_", m.group(1).lower())], [m.group(2)]))
        elif sections:
            sections[-1][1].append(line)
    return [(k, "\n".join(v).strip()) for k, v in sections]


def _split_keywords(text: str) -> list[tuple[str, str]]:
    marks = list(_INLINE.finditer(text))
    out = []
    for i, m in enumerate(marks):
        end = marks[i + 1].start() if i + 1 < len(marks) else len(text)
        out.append((_ALIASES[re.sub(r"\s+", "_", m.group(1).lower())], text[m.end():end].strip()))
    return out


# NOTE: the seed's (002) rule for a reply without any separator: sentences are split at 。！？ and line
# ends, and read by their opening words.
_EQUATION = re.compile(r"\d[^=]*=\s*[-+]?\d")
_ZH_SENTENCE = re.compile(r"[^。！？!?\n]+[。！？!?]?")
_ZH_REASON = re.compile(r"^\s*(?:\d+\s*[、.．)]\s*)?(?:根据|依据|按照|由于|因为|首先|其次|然后|接着|又因为|已知)")
_ZH_CHECK = re.compile(r"^\s*(?:\d+\s*[、.．)]\s*)?(?:验证|检验|校验|核验|代入|回代|复核)")
_ZH_CONCLUDE = re.compile(r"^\s*(?:\d+\s*[、.．)]\s*)?(?:综上所述|综上|因此|所以|故|结论是?|答案是|最终答案是?)[，,：:]?\s*")


def _split_zh_sentences(text: str) -> list[tuple[str, str]]:
    """Sections of a Chinese reply without labels, from its sentences' opening words (see the module docstring).

    Sentences before the first reasoning or check sentence are the context; the last concluding
    sentence is the outcome (its opening word dropped), earlier ones stay reasoning steps (the seed's
    step "因此非标资产余额为0" is one). Needs at least one reasoning sentence and a conclusion.
    """
    sentences = [m.group(0).strip() for m in _ZH_SENTENCE.finditer(text) if m.group(0).strip()]
    conclude = [i for i, t in enumerate(sentences) if _ZH_CONCLUDE.match(t)]
    first = next((i for i, t in enumerate(sentences) if _ZH_REASON.match(t) or _ZH_CHECK.match(t)), None)
    if not conclude or first is None or first >= conclude[-1]:
        return []
    last = conclude[-1]
    context = sentences[:first]
    reasoning = [t for t in sentences[first:last] if not _ZH_CHECK.match(t)]
    checks = [_ZH_CHECK.sub("", t, count=0).lstrip("：:，, ") for t in sentences[first:] if _ZH_CHECK.match(t)]
    # NOTE: "验证：0/50=0" names no check type; an equation it states is a recomputation.
    checks = [c if _type_of(c) is not None or not _EQUATION.search(c) else f"recomputation: {c}" for c in checks]
    out: list[tuple[str, str]] = []
    if context:
        out.append(("context", "\n".join(context)))
    out.append(("reasoning", "\n".join(reasoning)))
    if checks:
        out.append(("verification", "\n".join(checks)))
    out.append(("outcome", _ZH_CONCLUDE.sub("", sentences[last], count=1).rstrip("。！!")))
    return out


def _split_separators(text: str) -> list[tuple[str, str]]:
    chunks = [c.strip() for c in _SEPARATOR.split(text) if c.strip()]
    if len(chunks) < 3:
        return []
    out = []
    for i, chunk in enumerate(chunks[:4]):
        first, _, rest = chunk.partition("\n")
        m = _HEADING.match(first)
        if m:
            out.append((_ALIASES[re.sub(r"\s+", "_", m.group(1).lower())], (m.group(2) + "\n" + rest).strip()))
        else:
            out.append((SEGMENTS[i], chunk))
    return out


def _fill(trace: ParsedTrace, sections: list[tuple[str, Any]]) -> None:
    seen: set[str] = set()
    for key, body in sections:
        if key in seen and key != "outcome":
            trace.report.problems.append(f"{key}: repeated section ignored")
            continue
        seen.add(key)
        _READERS[key](body, trace)
    trace.report.found = [s for s in SEGMENTS if s in seen]


def parse_segmented(text: str) -> ParsedTrace:
    """Parse a reasoner reply into segments, trying json, separators, headings, then keywords.

    Example:
        >>> t = parse_segmented("Context: 2 apples\\nReasoning: 1. add 3\\nVerification: recompute: 2+3 = 5\\nAnswer: 5")
        >>> (t.report.format, t.answer, t.verification[0].type)
        ('keywords', '5', 'recomputation')
    """
    trace = ParsedTrace(report=ParseReport(format="none", ok=False))
    obj = _load_json(text) if "{" in text else None
    if isinstance(obj, dict):
        sections = [(k, v) for raw, v in obj.items() if (k := _canon_key(str(raw))) is not None]
        if sections:
            trace.report.format = "json"
            if "outcome" not in {k for k, _ in sections} and "confidence" in obj:
                sections.append(("outcome", {"answer": obj.get("answer"), "confidence": obj.get("confidence")}))
            unknown = [str(k) for k in obj if _canon_key(str(k)) is None and k != "confidence"]
            if unknown:
                trace.report.problems.append(f"unknown keys ignored: {', '.join(unknown[:5])}")
            _fill(trace, sections)
    if trace.report.format == "none":
        # NOTE: inline keywords win when they name two segments or more; a lone "验证：" in an unlabelled
        # Chinese reply yields to its sentences, and only then to the single keyword.
        for name, splitter, last in (("separators", _split_separators, False), ("headings", _split_headings, False),
                                     ("keywords", _split_keywords, False), ("keywords", _split_zh_sentences, False),
                                     ("keywords", _split_keywords, True)):
            sections = splitter(text)
            if len({k for k, _ in sections}) >= 2 or (sections and last):
                trace.report.format = name  # type: ignore[assignment]
                _fill(trace, sections)
                break
    missing = [s for s in SEGMENTS if s not in trace.report.found]
    if missing:
        trace.report.problems.append(f"missing segments: {', '.join(missing)}")
    if not trace.answer:
        trace.report.problems.append("no answer found")
    trace.report.ok = not missing and bool(trace.answer)
    return trace
