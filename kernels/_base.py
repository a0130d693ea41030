"""Shared bases of every layer: the pydantic base of every config and API schema, and lazy exports.

They live in the bottom layer so that every layer (kernels, memory_shards, serve, deployments)
can use them without importing one above it.

Unknown fields are rejected (``extra="forbid"``) so a typo in a YAML profile or a request
body is an error naming the field, never a silently ignored setting. Float fields refuse NaN and
+-Infinity (``allow_inf_nan=False``): Python's JSON parser accepts those literals, and a NaN
timestamp or quantity poisons comparisons, sorting and the JSON of every later answer. No
config or schema needs them (a missing bound or "never" is ``None``).
"""

from __future__ import annotations

import importlib
import math
import os
import re
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from pydantic import AfterValidator, BaseModel, ConfigDict

__all__ = ["CONTROL_CHARS", "NoControl", "StrictModel", "check_json", "lazy_exports", "no_control"]

CONTROL_CHARS = re.compile(r"[\x00-\x1f\x7f]")
"""C0 control characters and DEL: refused in ids, names and keys (see :func:`no_control`)."""


class StrictModel(BaseModel):
    """A pydantic model that rejects unknown fields and non-finite floats, and validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


def no_control(value: str | None) -> str | None:
    """``value`` unchanged, or ValueError when it holds a control character (U+0000-U+001F, U+007F).

    NOTE: for the short strings that name or key something (a source id, an author name, a
    reviewer, a metadata key): they are written to logs, traces and store keys, where a newline or
    NUL forges a log line or splits a key. Free text (a message, a memory's text) may hold newlines.

    Example:
        >>> no_control("conv-26:D1:3")
        'conv-26:D1:3'
    """
    if value is not None and CONTROL_CHARS.search(value):
        raise ValueError("must not hold control characters (U+0000-U+001F, U+007F)")
    return value


NoControl = AfterValidator(no_control)
"""Use as ``Annotated[str, NoControl]``: the field refuses control characters (:func:`no_control`)."""


def check_json(value: Any, path: str, *, max_depth: int = 4, max_items: int = 64, max_chars: int = 1000) -> Any:
    """Check a free-form JSON value (an ``Any`` field) and return it unchanged.

    ``allow_inf_nan`` covers float fields only; a value typed ``Any`` (a verification's inputs, a
    metadata map) needs the same rules by hand: finite numbers, strings of at most ``max_chars``,
    lists and maps of at most ``max_items`` entries, nesting of at most ``max_depth`` levels, integers
    of 64 bits.

    Raises:
        ValueError: naming the offending path (``input.rate``), e.g. for a NaN or a 1 MB string.

    Example:
        >>> check_json({"x": [1, 2.5, "km"]}, "input")
        {'x': [1, 2.5, 'km']}
    """
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"{path}: must be a finite number, got {value}")
    if isinstance(value, int) and not isinstance(value, bool) and not -(2**63) <= value < 2**63:
        # NOTE: past 64 bits no JSON reader but Python's keeps the value exact (JavaScript rounds past 2**53,
        # SQLite and numpy overflow): stored, it would come back as another number or not at all.
        raise ValueError(f"{path}: integers are 64-bit (-2**63 to 2**63-1), got one of {len(str(abs(value)))} digits")
    if isinstance(value, str) and len(value) > max_chars:
        raise ValueError(f"{path}: at most {max_chars} characters, got {len(value)}")
    if isinstance(value, (list, tuple, dict)):
        if max_depth <= 0:
            raise ValueError(f"{path}: nested too deeply")
        if len(value) > max_items:
            raise ValueError(f"{path}: at most {max_items} entries, got {len(value)}")
        items = value.items() if isinstance(value, dict) else enumerate(value)
        for key, item in items:
            if isinstance(key, str) and len(key) > 128:
                raise ValueError(f"{path}: key {key[:40]!r}... longer than 128 characters")
            check_json(item, f"{path}.{key}", max_depth=max_depth - 1, max_items=max_items, max_chars=max_chars)
    return value


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports ``names[name]`` on first use.

    A package whose public names pull in torch or faiss exports them this way, so that importing
    one of its light modules (a schema, a config) stays light.

    Example:
        >>> __getattr__ = lazy_exports(__name__, {"fused_topk": "recallserve.kernels._dispatch"})  # doctest: +SKIP
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__


def checkout_root_after_site_packages(path: list[str] | None = None) -> bool:
    """Move the source checkout's root, if it is on ``sys.path``, behind every other entry.

    NOTE: ``python -m ...`` run in the checkout (the README's ``python -m pytest``) and Ray workers of
    a driver started there (Ray adds the driver's working directory to its workers' path) put the
    checkout's root on ``sys.path``. There the folder ``kernels/`` (this package, installed as
    ``recallserve.kernels``) is also importable under the generic name ``kernels``, ahead of Hugging
    Face's ``kernels`` that transformers imports: every import of transformers then fails. Behind
    site-packages the root still serves what only it has (``tests``) and shadows nothing. An
    installed (non-editable) copy has no checkout root: nothing moves.

    Args:
        path: the search path to edit in place (default: ``sys.path``).

    Returns:
        Whether an entry moved.
    """
    path = sys.path if path is None else path
    root = Path(__file__).resolve().parents[1]
    if not (root / "pyproject.toml").is_file():
        return False
    hits = [p for p in path if Path(p or os.curdir).resolve() == root]
    if not hits or path[-len(hits):] == hits:
        return False
    for p in hits:
        path.remove(p)
    path.extend(hits)
    return True
