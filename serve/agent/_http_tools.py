"""Tools from config: an HTTP endpoint with a method, a URL template and a parameter schema.

The parameter schema is a small typed spec per argument (type, pattern, enum, bounds), turned
into a strict pydantic model with ``create_model`` so config tools validate exactly like code
tools. Path placeholders (``{order_id}``) are URL-quoted; the other arguments travel as query
parameters (GET/DELETE) or as a JSON body (POST/PUT).
"""

from __future__ import annotations

import string
from typing import Any, Literal
from urllib.parse import quote

from pydantic import ConfigDict, Field, create_model, model_validator

from recallserve.kernels import StrictModel
from recallserve.serve.agent.hints import RoutingHint
from recallserve.serve.agent.tools import Tool, ToolContext, ToolError

__all__ = ["HttpParamSpec", "HttpToolConfig", "build_http_tool"]

_TYPES: dict[str, type] = {"string": str, "integer": int, "number": float, "boolean": bool}


class HttpParamSpec(StrictModel):
    """One argument of an HTTP tool."""

    type: Literal["string", "integer", "number", "boolean"] = Field(description="JSON type.")
    description: str = Field(default="", max_length=300, description="Shown to the model.")
    required: bool = Field(default=True, description="Whether the model must pass it.")
    pattern: str | None = Field(default=None, description="Regex a string must match (e.g. ^\\d{6}$).")
    enum: list[str | int] | None = Field(default=None, min_length=1, description="Whitelist of allowed values.")
    minimum: float | None = Field(default=None, description="Lower bound of a number.")
    maximum: float | None = Field(default=None, description="Upper bound of a number.")
    max_length: int | None = Field(default=None, ge=1, le=10_000, description="Most characters of a string.")


class HttpToolConfig(StrictModel):
    """An HTTP tool declared in the serve profile."""

    name: str = Field(pattern=r"^[a-z][a-z0-9_]{1,47}$", description="Tool name the model uses.")
    description: str = Field(min_length=1, max_length=500, description="What it returns and when to use it.")
    method: Literal["GET", "POST", "PUT", "DELETE"] = Field(default="GET", description="HTTP method.")
    url_template: str = Field(
        min_length=8, description="URL with {placeholders} filled from arguments, e.g. https://x/orders/{order_id}."
    )
    params: dict[str, HttpParamSpec] = Field(default_factory=dict, max_length=8, description="Arguments.")
    scope: str = Field(min_length=1, description="Permission scope a tenant needs.")
    timeout_s: float = Field(default=5.0, gt=0, le=120, description="Request timeout.")
    headers: dict[str, str] = Field(default_factory=dict, description="Static request headers.")
    destructive: bool = Field(default=False, description="Changes state (needs a ':write' scope).")
    routing: RoutingHint | None = Field(
        default=None,
        description="When a question calls for the tool (serve.agent.routing); None = only the router model picks it.",
    )

    @model_validator(mode="after")
    def _placeholders(self) -> HttpToolConfig:
        if not self.url_template.startswith(("http://", "https://")):
            raise ValueError(f"url_template: must start with http:// or https://, got {self.url_template!r}")
        names = {f for _, f, _, _ in string.Formatter().parse(self.url_template) if f}
        missing = names - set(self.params)
        if missing:
            raise ValueError(f"url_template: placeholders {sorted(missing)} are not in params")
        if self.method in ("POST", "PUT", "DELETE") and not self.destructive:
            raise ValueError(f"destructive: a {self.method} tool must be declared destructive: true")
        return self


def _params_model(cfg: HttpToolConfig) -> type[Any]:
    fields: dict[str, Any] = {}
    for pname, spec in cfg.params.items():
        py: Any = _TYPES[spec.type]
        if spec.enum is not None:
            py = Literal[tuple(spec.enum)]  # type: ignore[valid-type]
        kwargs: dict[str, Any] = {"description": spec.description or pname}
        if spec.pattern is not None:
            kwargs["pattern"] = spec.pattern
        if spec.minimum is not None:
            kwargs["ge"] = spec.minimum
        if spec.maximum is not None:
            kwargs["le"] = spec.maximum
        if spec.max_length is not None:
            kwargs["max_length"] = spec.max_length
        if spec.required:
            fields[pname] = (py, Field(**kwargs))
        else:
            fields[pname] = (py | None, Field(default=None, **kwargs))
    model_name = "".join(p.capitalize() for p in cfg.name.split("_")) + "Args"
    return create_model(model_name, __config__=ConfigDict(extra="forbid"), **fields)


def build_http_tool(cfg: HttpToolConfig) -> Tool:
    """A :class:`Tool` that calls ``cfg``'s endpoint with httpx and returns the JSON (or text) body."""
    import httpx

    path_names = {f for _, f, _, _ in string.Formatter().parse(cfg.url_template) if f}

    async def call(args: Any, ctx: ToolContext) -> Any:
        values = args.model_dump(exclude_none=True)
        url = cfg.url_template.format(**{k: quote(str(values.get(k, "")), safe="") for k in path_names})
        rest = {k: v for k, v in values.items() if k not in path_names}
        async with httpx.AsyncClient(timeout=cfg.timeout_s, headers=cfg.headers) as client:
            if cfg.method in ("GET", "DELETE"):
                resp = await client.request(cfg.method, url, params=rest)
            else:
                resp = await client.request(cfg.method, url, json=rest)
        if resp.status_code >= 400:
            raise ToolError(f"{cfg.name}: HTTP {resp.status_code}: {resp.text[:200]}")
        if "json" in resp.headers.get("content-type", ""):
            return resp.json()
        return resp.text

    return Tool(
        name=cfg.name, description=cfg.description, params=_params_model(cfg), fn=call, scope=cfg.scope,
        timeout_s=cfg.timeout_s, cacheable=cfg.method == "GET", destructive=cfg.destructive, routing=cfg.routing,
    )
