"""API key -> tenant authentication, as a FastAPI dependency.

Keys come as ``Authorization: Bearer <key>`` (what the OpenAI SDKs send) or ``api-key: <key>``.
A missing or unknown key is a 401 with an OpenAI-style body.
"""

from __future__ import annotations

import hmac
from collections.abc import Mapping

from fastapi import Request

from serve.api.errors import APIError

__all__ = ["Authenticator"]


class Authenticator:
    """Maps API keys to tenant names.

    Example:
        >>> auth = Authenticator({"sk-local": "local"})
        >>> auth.tenant_for("sk-local")
        'local'
    """

    def __init__(self, keys: Mapping[str, str]) -> None:
        if not keys:
            raise ValueError("auth: no API keys configured (set auth.keys or RECALLSERVE_API_KEYS)")
        self._keys = dict(keys)

    def tenant_for(self, key: str) -> str | None:
        """The tenant of ``key``, or None. Compares in constant time."""
        found = None
        for known, tenant in self._keys.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                found = tenant
        return found

    async def __call__(self, request: Request) -> str:
        """FastAPI dependency: the caller's tenant, or a 401."""
        header = request.headers.get("authorization", "")
        key = header[7:].strip() if header.lower().startswith("bearer ") else request.headers.get("api-key", "").strip()
        if not key:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", type="authentication_error",
                           code="missing_api_key")
        tenant = self.tenant_for(key)
        if tenant is None:
            raise APIError(401, "invalid API key", type="authentication_error", code="invalid_api_key")
        return tenant
