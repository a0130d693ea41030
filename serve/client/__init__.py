"""``recallserve.client``: the one typed HTTP client of the recallserve API (sync and async, httpx).

Imported as ``recallserve.client`` (pyproject maps it from ``serve/client/``): it reads answers into
the API's own pydantic models, which live in ``serve``, so it sits in the ``serve`` layer; the
benches and load tests that call a running cluster live above it (``deployments/cli``,
``loadtests``). See docs/mcp.md for the quick start.
"""

from recallserve.client._calls import MODEL
from recallserve.client._client import AsyncRecallServe, RecallServe
from recallserve.client._core import DEFAULT_URL, Call, RetryPolicy
from recallserve.client._errors import ConnectionFailed, RecallServeError

__all__ = ["DEFAULT_URL", "MODEL", "AsyncRecallServe", "Call", "ConnectionFailed", "RecallServe", "RecallServeError",
           "RetryPolicy"]
