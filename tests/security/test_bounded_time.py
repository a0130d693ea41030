"""Input built to make the server's text scans quadratic is answered in bounded time.

* a message built to make the entity table quadratic (tens of thousands of e-mail-like tokens,
  amounts or title abbreviations) is answered in bounded time, with and without a session;
* the masker's e-mail pattern, and the entity table's e-mail and amount patterns, scanned a run
  without an ``@`` (or a ``1,1,1,...`` run) from every position to its end: O(n^2), seconds to
  minutes of one core for one request. Each pattern's leading repeat is bounded now, and such a
  run is still masked and stored.
"""

from __future__ import annotations

import re
import time
from re import _constants, _parser
from typing import Any

import pytest

from tests.security.conftest import A, Rig
from tests.unit.edge.conftest import headers

CHAT = {"model": "recallserve", "metadata": {"agent": "off"}, "messages": [{"role": "user", "content": "hi"}]}


# NOTE: each is one message of about 200,000 characters (the per-message cap): before the fix the
# e-mail run alone kept the event loop busy for minutes (an overlap check over every span taken,
# and each entity's snippet masking the whole text again).
HOSTILE_TEXTS = {
    "emails": "a@b." * 49_000,
    "amounts": " ".join(f"${i}" for i in range(30_000)),
    "titles": "Dr. " * 49_000,
}


@pytest.mark.parametrize("session", [False, True], ids=["sessionless", "session"])
@pytest.mark.parametrize("kind", sorted(HOSTILE_TEXTS))
def test_an_entity_heavy_message_is_answered_in_bounded_time(rig: Rig, kind: str, session: bool) -> None:
    meta = {"agent": "off"} | ({"session_id": f"hostile-{kind}"} if session else {})
    body = {**CHAT, "metadata": meta, "messages": [{"role": "user", "content": HOSTILE_TEXTS[kind]}]}
    start = time.monotonic()
    r = rig.client.post("/v1/chat/completions", json=body, headers=headers(A))
    elapsed = time.monotonic() - start
    # NOTE: a 400 (the message does not fit the context window) is an answer too; a 5xx is not.
    assert r.status_code < 500, r.text
    # NOTE: ~1-3 s on the 2-core host (linear in the text); the quadratic scan took minutes.
    assert elapsed < 20, f"{kind}: {elapsed:.1f} s"


def _json(rig: Rig, method: str, url: str, body: Any = None, tenant: str = A, **kw: Any) -> Any:
    return rig.client.request(method, url, json=body, headers=headers(tenant), **kw)


# ---- scans that were quadratic in the length of a run -------------------------------------------

def _leading_repeats(items) -> list[int]:  # type: ignore[no-untyped-def]
    """The most characters the first repeat of each alternative of a parsed pattern (after anchors,
    lookarounds and literal classes) may take from one start position: what one failed attempt at
    each position of a run costs. A group or alternation without a repeat is passed over."""
    for op, arg in items:
        if op in (_constants.MAX_REPEAT, _constants.MIN_REPEAT):
            return [int(arg[1])]
        inner: list[int] = []
        if op is _constants.SUBPATTERN:
            inner = _leading_repeats(arg[-1])
        elif op is _constants.BRANCH:
            inner = [n for branch in arg[1] for n in _leading_repeats(branch)]
        if inner:
            return inner
    return []


def _leading_repeat_max(pattern: re.Pattern[str]) -> int:
    """The largest of :func:`_leading_repeats` over ``pattern``'s alternatives."""
    found = _leading_repeats(_parser.parse(pattern.pattern))
    assert found, f"no repeat in {pattern.pattern!r}"
    return max(found)


def test_the_email_and_amount_scans_take_a_bounded_run_from_each_start() -> None:
    """The e-mail pattern of the masker and of the entity table, and the entity table's amount,
    began with an unbounded repeat of characters a long run is made of ("a" * n, "a." * n, "1," * n):
    each start position scanned the rest of the run and back, O(n^2) (40,000 "a"s: 10 s of one core
    in the masker; 40,000 characters of "1,": 45 s in the entity scan; a chat message may hold
    200,000). Measured with a deterministic property rather than a clock: the repeat a failed
    attempt runs through is bounded."""
    from recallserve.serve.context._entities import _PATTERNS
    from recallserve.serve.pii import _EMAIL

    scans = [("masker e-mail", _EMAIL),
             *((f"entity {kind} {i}", p) for i, (kind, p) in enumerate(_PATTERNS) if kind in ("email", "amount"))]
    assert len(scans) >= 3, scans
    for name, pattern in scans:
        # NOTE: every alternative counts: a currency-sign branch repeats only after its sign (\s? first).
        assert _leading_repeat_max(pattern) <= 64, (name, pattern.pattern)


def test_a_long_run_without_an_at_sign_is_masked_and_stored(rig: Rig) -> None:
    """The positive control of the bound: an address after a 31,000-character run is still masked
    (before the fix this request alone held the event loop for ~13 s: two masker passes)."""
    text = "a" * 31_000 + " mail jane.doe@example.com"
    r = _json(rig, "POST", "/v1/memories", {"memories": [{"text": text, "source_id": "long-run"}]})
    assert r.status_code == 200, r.text
    got = _json(rig, "GET", f"/v1/memories/{r.json()['ids'][0]}").json()
    assert got["text"].endswith(" mail [EMAIL]"), got["text"][-40:]
