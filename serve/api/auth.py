"""API key -> tenant authentication, as a FastAPI dependency.

Keys come as ``Authorization: Bearer <key>`` (what the OpenAI SDKs send) or ``api-key: <key>``.
A missing or unknown key is a 401 with an OpenAI-style body.
"""

from __future__ import annotations

import hashlib
import hmac
from collections.abc import Mapping, Sequence

from fastapi import Request

from recallserve.serve.api.errors import APIError
from recallserve.serve.pii import PiiMode, PiiPolicy

__all__ = ["Authenticator", "READ_ONLY_SCOPES", "RESERVED_TENANT_PREFIX", "key_id"]

#: Tenant names the server keeps for itself (the ingress's start-up recall runs as ``__warm_up__``);
#: no API key may map to one, so no client can read or write them.
RESERVED_TENANT_PREFIX = "__"
#: Tool scopes a tenant gets when the auth config names none for it: read-only (least privilege).
READ_ONLY_SCOPES: tuple[str, ...] = ("basic", "memory:read", "orders:read", "tickets:read", "inventory:read")


def key_id(key: str) -> str:
    """A non-secret id of an API key for audit logs: ``key_`` + 12 hex of its SHA-256."""
    return "key_" + hashlib.sha256(key.encode()).hexdigest()[:12]


class Authenticator:
    """Maps API keys to tenant names, and tenants to their tool scopes and PII policy.

    Args:
        keys: API key -> tenant.
        scopes: tenant -> tool permission scopes (auth config ``auth.scopes``).
        default_scopes: scopes of a tenant ``scopes`` does not name.
        pii: tenant -> ``mask | reject | allow`` (auth config ``auth.pii``).
        default_pii: policy of a tenant ``pii`` does not name (``mask``).
        retention: tenant -> retention limits in days (auth config ``auth.retention``; shown by the console).
        admins: tenants whose keys are operator (admin) keys (auth config ``auth.admin_tenants``): they
            may erase a whole tenant live (``DELETE /v1/tenants/{tenant}``) and read every tenant's
            erasure log; for everything else they are an ordinary tenant.

    Example:
        >>> auth = Authenticator({"sk-local": "local"}, {"local": ["basic", "orders:write"]})
        >>> auth.tenant_for("sk-local"), auth.scopes_for("local")
        ('local', ['basic', 'orders:write'])
    """

    def __init__(self, keys: Mapping[str, str], scopes: Mapping[str, Sequence[str]] | None = None,
                 default_scopes: Sequence[str] = READ_ONLY_SCOPES, pii: Mapping[str, PiiMode] | None = None,
                 default_pii: PiiMode = "mask", retention: Mapping[str, Mapping[str, float | None]] | None = None,
                 admins: Sequence[str] = ()) -> None:
        if not keys:
            raise ValueError("auth: no API keys configured (set auth.keys or RECALLSERVE_API_KEYS)")
        reserved = sorted({t for t in keys.values() if t.startswith(RESERVED_TENANT_PREFIX)})
        if reserved:
            raise ValueError(f"auth.keys: tenant names starting with {RESERVED_TENANT_PREFIX!r} are reserved for the "
                             f"server's own use (e.g. the start-up warm-up): {reserved}")
        self._keys = dict(keys)
        self._scopes = {t: list(s) for t, s in (scopes or {}).items()}
        self._default_scopes = list(default_scopes)
        self.pii = PiiPolicy(pii, default_pii)
        self._retention = {t: dict(r) for t, r in (retention or {}).items()}
        bad = sorted(t for t in admins if not t or t.startswith(RESERVED_TENANT_PREFIX))
        if bad:
            raise ValueError(f"auth.admin_tenants: not tenant names an API key may map to: {bad}")
        self._admins = frozenset(admins)

    def is_admin(self, tenant: str) -> bool:
        """Whether ``tenant``'s keys are admin keys (``auth.admin_tenants``)."""
        return tenant in self._admins

    def retention_for(self, tenant: str) -> dict[str, float | None]:
        """Retention limits of ``tenant`` in days (``memories_days``, ``sessions_days``, ``traces_days``;
        None or missing = kept until deleted), from the auth config's ``retention``."""
        return dict(self._retention.get(tenant, {}))

    def scopes_for(self, tenant: str) -> list[str]:
        """Tool scopes of ``tenant`` (the default scopes when the config names none for it)."""
        return list(self._scopes.get(tenant, self._default_scopes))

    def pii_for(self, tenant: str) -> PiiMode:
        """PII policy of ``tenant`` for what it writes (the default policy when the config names none)."""
        return self.pii.mode_for(tenant)

    def tenant_for(self, key: str) -> str | None:
        """The tenant of ``key``, or None. Compares in constant time."""
        found = None
        for known, tenant in self._keys.items():
            if hmac.compare_digest(known.encode(), key.encode()):
                found = tenant
        return found

    async def __call__(self, request: Request) -> str:
        """FastAPI dependency: the caller's tenant, or a 401."""
        # NOTE: two credentials (two Authorization headers, or two api-key headers) are refused,
        # not resolved by taking one: which one a proxy or server picks differs, so the tenant would.
        for name in ("authorization", "api-key"):
            if len(request.headers.getlist(name)) > 1:
                raise APIError(401, f"{name}: sent {len(request.headers.getlist(name))} times; send one API key",
                               type="authentication_error", param=name, code="ambiguous_api_key")
        header = request.headers.get("authorization", "")
        bearer = header[7:].strip() if header.lower().startswith("bearer ") else ""
        api_key = request.headers.get("api-key", "").strip()
        if bearer and api_key and not hmac.compare_digest(bearer.encode(), api_key.encode()):
            # NOTE: the same ambiguity as two Authorization headers: the key used must not depend
            # on which header a proxy or the server reads first.
            raise APIError(401, "authorization, api-key: two different API keys sent; send one",
                           type="authentication_error", param="api-key", code="ambiguous_api_key")
        key = bearer or api_key
        if not key and header.strip():
            # NOTE: a header that is there but not "Bearer <key>" (a tab after Bearer, "Basic ...", "Bearer"
            # alone) is named as such, not answered "missing", which sends the caller looking elsewhere.
            raise APIError(401, "authorization: not of the form 'Bearer <key>' (one space, then the key)",
                           type="authentication_error", param="authorization", code="invalid_authorization")
        if not key:
            raise APIError(401, "missing API key: send 'Authorization: Bearer <key>'", type="authentication_error",
                           code="missing_api_key")
        tenant = self.tenant_for(key)
        if tenant is None:
            raise APIError(401, "invalid API key", type="authentication_error", code="invalid_api_key")
        # NOTE: read by the request metrics (serve.api.observe) for the tenant's own Health figures.
        request.state.tenant = tenant
        # NOTE: the audit of erasures and exports names the key that asked by this id, never the key.
        request.state.key_id = key_id(key)
        return tenant
