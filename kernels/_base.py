"""Shared pydantic base for every config and API schema in recallserve.

It lives in the bottom layer so that every layer (kernels, memory_shards, serve, deployments)
can use it without importing one above it.

Unknown fields are rejected (``extra="forbid"``) so a typo in a YAML profile or a request
body is an error naming the field, never a silently ignored setting.
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict

__all__ = ["StrictModel"]


class StrictModel(BaseModel):
    """A pydantic model that rejects unknown fields and validates on assignment."""

    model_config = ConfigDict(extra="forbid", validate_assignment=True, frozen=False)
