"""The client's exceptions: the API's error envelope as a Python exception."""

from __future__ import annotations

from typing import Any

from recallserve.serve.api.errors import APIError

__all__ = ["RecallServeError", "ConnectionFailed"]


class RecallServeError(APIError):
    """An error answer of the API (4xx/5xx), carrying its envelope's fields: the server's
    :class:`~recallserve.serve.api.errors.APIError` as the client received it.

    Attributes:
        status: the HTTP status (400, 401, 404, 413, 429, 503, ...).
        message: the API's message, the field first (``"query: must contain non-whitespace text"``).
        type: the envelope's ``type`` (``invalid_request_error``, ``authentication_error``, ...; ``error``
            when the answer was not the API's envelope).
        param: the field at fault, when the API named one.
        code: the envelope's ``code`` (``invalid_api_key``, ``personal_data``, ...), when given.
        request_id: the answer's ``x-request-id`` (what the server logged it under).
        retry_after_s: the answer's ``Retry-After`` in seconds, when it sent one.
        enveloped: the body was the API's JSON ``{"error": {...}}`` envelope (False: someone else's
            answer, e.g. a proxy's plain-text refusal, whose start is then the ``message``).
    """

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, request_id: str | None = None, retry_after_s: float | None = None,
                 enveloped: bool = True) -> None:
        super().__init__(status, message, type=type or "error", param=param, code=code)
        self.request_id = request_id
        self.retry_after_s = retry_after_s
        self.enveloped = enveloped

    def __str__(self) -> str:
        return f"{self.status} {self.type}: {self.message}"

    @classmethod
    def from_body(cls, status: int, body: Any, request_id: str | None, retry_after_s: float | None) -> RecallServeError:
        """The exception of an answer whose body is (or is not) the API's ``{"error": {...}}`` envelope."""
        error = body.get("error") if isinstance(body, dict) else None
        if not isinstance(error, dict):
            # NOTE: not the API's envelope (a proxy's page, a 502 from a load balancer): its start, clipped.
            return cls(status, f"HTTP {status}: {str(body)[:200]}", request_id=request_id, retry_after_s=retry_after_s,
                       enveloped=False)
        return cls(status, str(error.get("message", "")), type=error.get("type"), param=error.get("param"),
                   code=error.get("code"), request_id=request_id, retry_after_s=retry_after_s)


class ConnectionFailed(RecallServeError):
    """No answer at all (refused connection, timeout) after the retries; ``status`` is 0.

    Attributes:
        reason: the transport failure's name (``ConnectError``, ``ReadTimeout``, ...): what a load
            test counts in place of a status.
    """

    def __init__(self, message: str, reason: str = "ConnectionFailed") -> None:
        super().__init__(0, message, type="connection_error", enveloped=False)
        self.reason = reason
