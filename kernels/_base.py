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
from collections.abc import Callable, Mapping
from typing import Any

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel", "lazy_exports"]


class StrictModel(BaseModel):
    """A pydantic model that rejects unknown fields and non-finite floats, and validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False, allow_inf_nan=False)


def lazy_exports(package: str, names: Mapping[str, str]) -> Callable[[str], Any]:
    """A package's module ``__getattr__`` (PEP 562) that imports ``names[name]`` on first use.

    A package whose public names pull in torch or faiss exports them this way, so that importing
    one of its light modules (a schema, a config) stays light.

    Example:
        >>> __getattr__ = lazy_exports(__name__, {"fused_topk": "kernels._dispatch"})  # doctest: +SKIP
    """

    def __getattr__(name: str) -> Any:
        if name in names:
            return getattr(importlib.import_module(names[name]), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    return __getattr__
