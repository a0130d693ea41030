"""What the sync and async clients share: the calls (path, body, result model), retries, decoding.

Each endpoint is described once, as a :class:`Call` built by a function of :mod:`._calls`; the two
clients differ only in how they send it (``httpx.Client`` or ``httpx.AsyncClient``) and sleep.

Retries: a 429 or 503 answer (refused before any work: rate, admission, a memory outage) is
retried for every method; a connection failure or timeout only for GET and DELETE (a POST that
timed out may have been applied). The wait before retry ``n`` (0-based) is the answer's
``Retry-After`` when it sent one, else ``backoff_s x 2^n``, capped at ``max_backoff_s`` either way.
"""

from __future__ import annotations

import email.utils
import time
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

import httpx
from pydantic import BaseModel, Field, TypeAdapter

from recallserve.kernels import StrictModel
from recallserve.client._errors import RecallServeError

__all__ = ["Call", "RetryPolicy", "decode", "headers_for", "retry_delay", "retryable_status", "DEFAULT_URL"]

T = TypeVar("T")
DEFAULT_URL = "http://127.0.0.1:8000"
#: Statuses retried for every method: the request was refused before any work was done.
RETRY_STATUSES = frozenset({429, 503})
#: Methods retried after a connection failure (safe to repeat).
IDEMPOTENT = frozenset({"GET", "HEAD", "DELETE"})


class RetryPolicy(StrictModel):
    """How often and how long the client retries (see the module docstring for the rules)."""

    max_retries: int = Field(default=2, ge=0, le=100, description="Retries after the first try (0 = none).")
    backoff_s: float = Field(default=0.5, ge=0, le=60, description="Wait before the first retry without Retry-After.")
    max_backoff_s: float = Field(default=20.0, ge=0, le=600, description="Longest single wait (Retry-After included).")


@dataclass(frozen=True)
class Call(Generic[T]):
    """One request: method, path, JSON body, query parameters and the type its answer is read as."""

    method: str
    path: str
    result: Any
    json: Any = None
    params: dict[str, Any] = field(default_factory=dict)


def headers_for(api_key: str | None) -> dict[str, str]:
    """The bearer token header (what the OpenAI SDKs send), or none."""
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _retry_after(response: httpx.Response) -> float | None:
    """``Retry-After`` in seconds: a number, or an HTTP date (RFC 9110), or None."""
    value = response.headers.get("retry-after")
    if value is None:
        return None
    try:
        return max(0.0, float(value))
    except ValueError:
        when = email.utils.parsedate_to_datetime(value) if value.strip() else None
        return None if when is None else max(0.0, when.timestamp() - time.time())


def retryable_status(call: Call[Any], status: int) -> bool:
    """A refused-before-work answer: retried whatever the method."""
    del call
    return status in RETRY_STATUSES


def retry_delay(policy: RetryPolicy, attempt: int, response: httpx.Response | None) -> float:
    """Seconds to wait before retry ``attempt`` (0-based): ``Retry-After``, else exponential backoff."""
    hinted = _retry_after(response) if response is not None else None
    wait = hinted if hinted is not None else policy.backoff_s * (2 ** attempt)
    return min(wait, policy.max_backoff_s)


def decode(call: Call[T], response: httpx.Response) -> T:
    """The answer as ``call.result`` (a pydantic model or type), or :class:`RecallServeError` for an error."""
    if response.status_code >= 400:
        try:
            body: Any = response.json()
        except ValueError:
            body = response.text
        raise RecallServeError.from_body(response.status_code, body, response.headers.get("x-request-id"),
                                         _retry_after(response))
    if call.result is str:
        return response.text  # type: ignore[return-value]
    if isinstance(call.result, type) and issubclass(call.result, BaseModel):
        return call.result.model_validate_json(response.content)  # type: ignore[return-value]
    return TypeAdapter(call.result).validate_json(response.content)  # type: ignore[no-any-return]
