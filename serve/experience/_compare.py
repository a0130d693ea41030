"""How a computed value compares with an expected one: the verifier's tolerances, in one place.

Every module that asks "is this the same number" (the verifier's templates, whether a check
computed the answer) reads them here, so the verifier and its confidence rules cannot drift apart.
"""

from __future__ import annotations

import math
from typing import Any

from recallserve.serve.experience._schema import VerificationStatus

__all__ = ["compare_values", "as_bool"]

# NOTE: 1e-6 relative is "the same number"; up to 1% is what rounding an answer to 2-3
# significant digits produces (33.3 for 33.33...), so it is doubtful rather than wrong.
_REL_PASS = 1e-6
_REL_DOUBT = 1e-2
_ABS_EPS = 1e-9

_TRUE = {"true", "yes", "pass", "passed", "compliant", "ok", "allowed", "holds", "valid", "1"}
_FALSE = {"false", "no", "fail", "failed", "violation", "non-compliant", "noncompliant", "not allowed", "invalid", "0"}


def compare_values(actual: float, expected: float) -> VerificationStatus:
    """``pass`` within 1e-6 relative, ``doubtful`` within 1% (rounding), else ``fail``."""
    if math.isnan(actual) or math.isnan(expected):
        return "fail"
    err = abs(actual - expected)
    scale = max(abs(actual), abs(expected))
    if err <= max(_ABS_EPS, _REL_PASS * scale):
        return "pass"
    if err <= _REL_DOUBT * scale:
        return "doubtful"
    return "fail"


def as_bool(x: Any) -> bool | None:
    """``x`` read as a yes/no (``True``, ``"compliant"``, ``"no"`` ...), or None when it is neither."""
    if isinstance(x, bool):
        return x
    if isinstance(x, str) and x.strip().lower() in _TRUE:
        return True
    if isinstance(x, str) and x.strip().lower() in _FALSE:
        return False
    return None
