"""The remote adapter: any OpenAI-compatible ``/chat/completions`` endpoint over httpx.

Works with an existing vLLM server, llama-cpp-python's server or a hosted API. Non-streaming
calls post JSON; streaming reads server-sent events (``data: {...}`` lines, ``data: [DONE]``).
HTTP and transport failures become :class:`recallserve.serve.engine.EngineError` naming the status and body.
"""

from __future__ import annotations

import json
import time
from collections.abc import AsyncIterator, Sequence
from typing import Any

import httpx

from recallserve.deployments.engines._common import finish_reason, sampling_kwargs, to_openai_messages
from recallserve.deployments.engines._config import RemoteConfig
from recallserve.serve import envs
from recallserve.serve.engine import ChatDelta, ChatMessage, ChatResult, EngineError, GenerationParams
from recallserve.serve.tokens import count_tokens

__all__ = ["RemoteOpenAIEngine"]

# NOTE: error bodies are echoed into messages and logs; cap them so an HTML error page does not
# flood either.
_BODY_LIMIT = 500



def _cached(usage: dict[str, Any], prompt_tokens: int) -> int:
    """``usage.prompt_tokens_details.cached_tokens`` of an OpenAI-style reply (0 when absent or
    malformed), never more than the prompt."""
    details = usage.get("prompt_tokens_details")
    cached = details.get("cached_tokens") if isinstance(details, dict) else None
    return max(0, min(int(cached), prompt_tokens)) if isinstance(cached, int) else 0

class RemoteOpenAIEngine:
    """:class:`recallserve.serve.engine.LLMEngine` over an OpenAI-compatible HTTP endpoint.

    Example:
        >>> cfg = RemoteConfig(base_url="http://127.0.0.1:8001/v1", model="qwen")  # doctest: +SKIP
        >>> (await RemoteOpenAIEngine(cfg).chat(msgs, GenerationParams())).text  # doctest: +SKIP
    """

    def __init__(self, config: RemoteConfig, *, transport: httpx.AsyncBaseTransport | None = None) -> None:
        """Create the HTTP client (no request is made until the first call).

        Args:
            config: Endpoint, model and timeouts.
            transport: An httpx transport, e.g. ``httpx.ASGITransport(app)`` to call an ASGI app
                in-process; default: the network.

        Raises:
            EngineError: ``api_key_env`` names a variable that is not set.
        """
        self._config = config
        headers = {"Accept": "application/json"}
        if config.api_key_env is not None:
            key = envs.named_secret(config.api_key_env)
            if key is None:
                raise EngineError(f"api_key_env: environment variable {config.api_key_env} is not set")
            headers["Authorization"] = f"Bearer {key}"
        timeout = httpx.Timeout(config.timeout_s, connect=config.connect_timeout_s)
        base = config.base_url.rstrip("/") + "/"
        self._client = httpx.AsyncClient(base_url=base, headers=headers, timeout=timeout, transport=transport)
        # NOTE: vLLM serves /tokenize at the server root, beside /v1, not under it.
        root = httpx.URL(base)
        self._root = root.copy_with(path=root.path.removesuffix("/").removesuffix("/v1") + "/")
        self._tokenizer: str | None = None if config.tokenizer == "auto" else config.tokenizer

    @property
    def model_name(self) -> str:
        """The remote model name from config."""
        return self._config.model

    @property
    def context_window(self) -> int:
        """``context_window`` from config (the endpoint does not report it reliably)."""
        return self._config.context_window

    def _body(self, messages: Sequence[ChatMessage], params: GenerationParams, stream: bool) -> dict[str, Any]:
        body: dict[str, Any] = {"model": self._config.model, "messages": to_openai_messages(messages)}
        body.update(sampling_kwargs(params))
        if params.json_schema is not None:
            if self._config.json_mode == "json_schema":
                body["response_format"] = {
                    "type": "json_schema",
                    # NOTE: no `strict`: OpenAI's strict mode rejects schemas that leave properties
                    # optional; vLLM enforces the schema either way.
                    "json_schema": {"name": "reply", "schema": params.json_schema},
                }
            else:
                body["response_format"] = {"type": "json_object", "schema": params.json_schema}
        if stream:
            body["stream"] = True
            if self._config.stream_usage:
                body["stream_options"] = {"include_usage": True}
        return body

    def _error(self, what: str, response: httpx.Response, body: str) -> EngineError:
        return EngineError(
            f"{what}: {self._config.base_url} answered HTTP {response.status_code}: {body[:_BODY_LIMIT]}"
        )

    async def chat(self, messages: Sequence[ChatMessage], params: GenerationParams) -> ChatResult:
        """POST one chat completion and return its first choice."""
        start = time.perf_counter()
        try:
            response = await self._client.post("chat/completions", json=self._body(messages, params, stream=False))
        except httpx.HTTPError as exc:
            raise EngineError(f"chat: request to {self._config.base_url} failed: {exc!r}") from exc
        if response.status_code != 200:
            raise self._error("chat", response, response.text)
        try:
            data = response.json()
            choice = data["choices"][0]
            text = choice["message"].get("content") or ""
            usage = data.get("usage") or {}
        except (ValueError, KeyError, IndexError, TypeError) as exc:
            raise EngineError(f"chat: malformed reply from {self._config.base_url}: {response.text[:_BODY_LIMIT]}") from exc
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        if prompt_tokens is None:
            prompt_tokens = await self.count_tokens("\n".join(m.content for m in messages))
        if completion_tokens is None:
            completion_tokens = await self.count_tokens(text)
        return ChatResult(
            text=text,
            prompt_tokens=prompt_tokens,
            completion_tokens=completion_tokens,
            finish_reason=finish_reason(choice.get("finish_reason")),
            model=self._config.model,
            cached_tokens=_cached(usage, prompt_tokens),
            engine_ms=1e3 * (time.perf_counter() - start),
        )

    async def stream(self, messages: Sequence[ChatMessage], params: GenerationParams) -> AsyncIterator[ChatDelta]:
        """Read the SSE stream; the last delta carries the finish reason and token counts.

        Counts come from the usage chunk when the server sends one; otherwise they are counted
        with :meth:`count_tokens` on the prompt text and the generated text.
        """
        start = time.perf_counter()
        body = self._body(messages, params, stream=True)
        pieces: list[str] = []
        reason: str | None = None
        usage: dict[str, Any] | None = None
        try:
            async with self._client.stream("POST", "chat/completions", json=body) as response:
                if response.status_code != 200:
                    raise self._error("stream", response, (await response.aread()).decode(errors="replace"))
                async for line in response.aiter_lines():
                    if not line.startswith("data:"):
                        continue  # blank separators, comments, `event:` lines
                    payload = line[5:].strip()
                    if payload == "[DONE]":
                        break
                    try:
                        chunk = json.loads(payload)
                    except ValueError as exc:
                        raise EngineError(f"stream: malformed event from {self._config.base_url}: {payload[:_BODY_LIMIT]}") from exc
                    if "error" in chunk:
                        raise EngineError(f"stream: {self._config.base_url} reported: {str(chunk['error'])[:_BODY_LIMIT]}")
                    usage = chunk.get("usage") or usage
                    for choice in chunk.get("choices") or []:
                        text = (choice.get("delta") or {}).get("content")
                        if text:
                            pieces.append(text)
                            yield ChatDelta(text=text)
                        reason = choice.get("finish_reason") or reason
        except httpx.HTTPError as exc:
            raise EngineError(f"stream: request to {self._config.base_url} failed: {exc!r}") from exc
        usage = usage or {}
        prompt_tokens = usage.get("prompt_tokens")
        completion_tokens = usage.get("completion_tokens")
        if prompt_tokens is None:
            prompt_tokens = await self.count_tokens("\n".join(m.content for m in messages))
        if completion_tokens is None:
            completion_tokens = await self.count_tokens("".join(pieces))
        yield ChatDelta(finish_reason=finish_reason(reason), prompt_tokens=prompt_tokens,
                        completion_tokens=completion_tokens, cached_tokens=_cached(usage, prompt_tokens),
                        engine_ms=1e3 * (time.perf_counter() - start))

    async def _tokenize_route(self, kind: str, text: str) -> int | None:
        if kind == "vllm":
            url, body, key = self._root.join("tokenize"), {"model": self._config.model, "prompt": text}, "count"
        else:
            url, body, key = self._root.join("extras/tokenize/count"), {"input": text}, "count"
        try:
            response = await self._client.post(url, json=body)
        except httpx.HTTPError as exc:
            raise EngineError(f"count_tokens: request to {url} failed: {exc!r}") from exc
        if response.status_code in (404, 405):
            return None
        if response.status_code != 200:
            raise self._error("count_tokens", response, response.text)
        data = response.json()
        value = data.get(key)
        if value is None:
            return None
        return value if isinstance(value, int) else len(value)

    async def count_tokens(self, text: str) -> int:
        """Tokens by the server's tokenizer when it has a tokenize route, else a tiktoken estimate.

        With ``tokenizer: auto`` the routes are probed once (vLLM ``/tokenize``, then llama.cpp
        ``/extras/tokenize/count``) and the first that answers is used from then on. Both
        servers count the BOS token where the model adds one.
        """
        if self._tokenizer is None:
            for kind in ("vllm", "llama_cpp"):
                count = await self._tokenize_route(kind, text)
                if count is not None:
                    self._tokenizer = kind
                    return count
            self._tokenizer = "tiktoken"
        if self._tokenizer == "tiktoken":
            return count_tokens(text)
        count = await self._tokenize_route(self._tokenizer, text)
        if count is None:
            raise EngineError(f"count_tokens: {self._config.base_url} has no {self._tokenizer} tokenize route")
        return count

    async def close(self) -> None:
        """Close the HTTP client."""
        await self._client.aclose()
