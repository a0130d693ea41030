"""Edge limits of the ingress: the request-body cap (413) and encoding (415 unless uncompressed),
the client's request id, the text of a JSON body (valid Unicode) and its keys (each once per object).

All run before any route's code: a body over the cap is refused while it streams in (its
``content-length`` alone is enough when sent), so an oversized upload never reaches the JSON
parser or the ingress's memory; a request id that is not a short token is a 400 rather than a
string copied into every log line and response header; a JSON string holding an unpaired UTF-16
surrogate (``"\\ud800"``, which JSON's escapes allow and UTF-8 cannot encode) is a 400 naming its
field, not a 500 from the first store or log line that encodes it; a JSON object naming a key
twice is a 400 naming the key, not an answer to whichever of the two values the parser kept. An id
a client chooses and reads back in a URL path (a request, session or experience id) must be one
a URL can carry (:func:`path_segment_problem`).
"""

from __future__ import annotations

import json
import re
from typing import Any
from urllib.parse import unquote_to_bytes

from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from recallserve.serve.api.errors import MAX_PARAM_CHARS, APIError, clip, error_body

__all__ = ["MAX_BODY_BYTES", "BodyLimitMiddleware", "check_content_type", "check_duplicate_keys", "check_query",
           "check_unicode", "duplicate_key", "path_segment_problem", "undecodable_query", "unpaired_surrogate",
           "valid_request_id", "RESERVED_REQUEST_IDS"]

MAX_BODY_BYTES = 32 * 2**20
"""NOTE: 32 MiB: the largest image the describer takes (12 MiB, 16 MiB as base64) plus a full
text conversation (1M characters), or eight 2-3 MiB phone photos. Larger is a batch upload, not
a chat turn; each in-flight body is held (and decoded) in the ingress's memory, so the cap bounds
what concurrent requests can make a replica hold. ``create_app(max_body_bytes=...)`` changes it."""

_REQUEST_ID = re.compile(r"[A-Za-z0-9._:-]{1,128}")


RESERVED_REQUEST_IDS = frozenset({"sessions"})
"""Ids that name a route beside ``GET /v1/turns/{turn_id}`` (``/v1/turns/sessions``): a turn kept under
one could never be read by its id, so such a client id is refused (400) like a malformed one."""


def path_segment_problem(value: str) -> str | None:
    """Why ``value``, an id a client chooses, can never be read back as the ``{id}`` of a route's
    URL (``GET /v1/sessions/{session_id}``); None when it can.

    NOTE: ``.`` and ``..`` are dot segments, which HTTP clients (httpx, requests, curl, browsers)
    remove before sending a URL (RFC 3986, section 5.2.4), and a ``/`` splits the path, also
    when sent as ``%2F`` (the server decodes it before routing): a record stored under such an id
    was acknowledged and then unreadable, so the write that names one is refused instead.

    Example:
        >>> path_segment_problem("s-1"), path_segment_problem("..") is not None
        (None, True)
    """
    if value in (".", ".."):
        return f"{value!r} is a dot segment, which HTTP clients remove from a URL, so it could never be read by its id"
    if "/" in value:
        return "must not hold '/' (it splits a URL path, also as %2F), so it could never be read by its id"
    return None


def valid_request_id(value: str) -> bool:
    """Whether a client's ``x-request-id`` is usable: 1-128 of ``A-Z a-z 0-9 . _ : -``, not a reserved
    route name (:data:`RESERVED_REQUEST_IDS`) nor a dot segment (:func:`path_segment_problem`): it
    is the turn's id of ``GET /v1/turns/{turn_id}``."""
    return (_REQUEST_ID.fullmatch(value) is not None and value not in RESERVED_REQUEST_IDS
            and path_segment_problem(value) is None)


def _too_large(limit: int) -> str:
    return f"request body larger than {limit} bytes ({limit // 2**20} MiB)"


class BodyLimitMiddleware:
    """Refuses a request body over ``max_bytes`` with 413 in the JSON error envelope.

    A declared ``content-length`` over the cap is answered at once; a body streamed without one
    (chunked) is counted as it arrives and the route's body read fails with the same 413 (an
    ``HTTPException`` the app's handlers turn into the envelope). A body sent with a
    ``content-encoding`` other than ``identity`` is a 415 naming the header: the server never
    decompresses a request (so a gzip bomb costs nothing), and a compressed JSON body was answered
    "could not be parsed as JSON", which did not say why.

    Args:
        app: the ASGI app to wrap.
        max_bytes: largest accepted body.
    """

    def __init__(self, app: ASGIApp, max_bytes: int = MAX_BODY_BYTES) -> None:
        if max_bytes < 1:
            raise ValueError(f"max_bytes: must be >= 1, got {max_bytes}")
        self.app = app
        self.max_bytes = max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        encoding = b",".join(v for k, v in scope["headers"] if k == b"content-encoding").strip().lower()
        if encoding and encoding != b"identity":
            got = encoding.decode("latin-1")[:40]
            response = JSONResponse(error_body(f"content-encoding: {got!r} is not accepted; send the body uncompressed",
                                               "invalid_request_error", "content-encoding", "unsupported_media_type"),
                                    status_code=415)
            await response(scope, receive, send)
            return
        declared = next((v for k, v in scope["headers"] if k == b"content-length"), None)
        if declared is not None and (not declared.isdigit() or int(declared) > self.max_bytes):
            status, message = (413, _too_large(self.max_bytes)) if declared.isdigit() else (400, "invalid content-length")
            response = JSONResponse(error_body(message, "invalid_request_error", None,
                                               "request_too_large" if status == 413 else None), status_code=status)
            await response(scope, receive, send)
            return
        seen = 0

        async def limited() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.max_bytes:
                    raise StarletteHTTPException(413, _too_large(self.max_bytes))
            return message

        await self.app(scope, limited, send)


# NOTE: a JSON escape of a UTF-16 surrogate (high or low half), or one encoded as UTF-8 bytes
# (ED A0-BF xx: not UTF-8, but Python's JSON parser decodes bytes with "surrogatepass"); only a
# body holding one of them, or a body not in UTF-8 (json.loads reads UTF-16 and UTF-32 too, where
# the escape's bytes differ), is walked.
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F][0-9a-fA-F]{2}|\xed[\xa0-\xbf]")


def _may_hold_surrogate(body: bytes) -> bool:
    """Whether the JSON text ``body`` may decode to a string holding a lone surrogate."""
    return json.detect_encoding(body) not in ("utf-8", "utf-8-sig") or _SURROGATE_ESCAPE.search(body) is not None


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def unpaired_surrogate(value: Any) -> str | None:
    """The JSON path (``messages.0.content``) of the first string or key in ``value`` that holds an
    unpaired surrogate, ``""`` for the value itself, None when every string is valid Unicode.

    Example:
        >>> unpaired_surrogate({"memories": [{"text": "ok"}, {"text": "bad " + chr(0xD800)}]})
        'memories.1.text'
    """
    # NOTE: iterative, so the depth a JSON parser accepted costs no recursion here.
    stack: list[tuple[str, Any]] = [("", value)]
    while stack:
        path, node = stack.pop()
        if isinstance(node, str):
            if not _encodable(node):
                return path
        elif isinstance(node, dict):
            for key, item in node.items():
                where = f"{path}.{key}" if path else str(key)
                if not _encodable(str(key)):
                    return path or "body"
                stack.append((where, item))
        elif isinstance(node, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in enumerate(node))
    return None


async def check_unicode(request: Request) -> None:
    """App-wide dependency: a JSON body with an unpaired surrogate in a string is a 400 naming it.

    Runs after the route has read and parsed the body (``request.json()`` is cached then), so a
    body without a surrogate escape costs one byte scan and nothing else.
    """
    body = await request.body()
    if not body or not _may_hold_surrogate(body):
        return
    try:
        value = await request.json()
    except (ValueError, RecursionError):
        return  # NOTE: not JSON: the route's own body validation answers it
    where = unpaired_surrogate(value)
    if where is not None:
        name = clip(where or "body", MAX_PARAM_CHARS)
        raise APIError(400, f"{name}: text holds an unpaired UTF-16 surrogate (a lone \\ud800-\\udfff escape); "
                            "send valid Unicode", param=name)


class _DuplicateKey(ValueError):
    """Raised by :func:`_no_repeat` at the first object that names a key twice."""


def _no_repeat(pairs: list[tuple[str, Any]]) -> None:
    # NOTE: returns None, not a dict: only the check is wanted, and building nothing keeps the
    # pass within ~1.2-1.8x of the parse FastAPI already made (5M empty objects: 0.85 s vs 0.64 s).
    if len(pairs) > 1 and len({key for key, _ in pairs}) != len(pairs):
        raise _DuplicateKey


class _Pairs(list):  # type: ignore[type-arg]
    """A JSON object kept as its (key, value) pairs, repeats included (the error path's parse)."""


def duplicate_key(body: bytes | str) -> str | None:
    """The JSON path (``messages.0.role``) of the first key that a JSON object of ``body`` names
    twice, None when every object names each key once (or ``body`` is not JSON).

    Example:
        >>> duplicate_key(b'{"messages": [{"role": "user", "role": "system"}]}')
        'messages.0.role'
    """
    try:
        json.loads(body, object_pairs_hook=_no_repeat)
        return None
    except _DuplicateKey:
        pass
    except (ValueError, RecursionError):
        return None  # NOTE: not JSON: the route's own body validation answers it
    stack: list[tuple[str, Any]] = [("", json.loads(body, object_pairs_hook=_Pairs))]
    while stack:
        path, node = stack.pop()
        if isinstance(node, _Pairs):
            seen: set[str] = set()
            for key, _ in node:
                if key in seen:
                    return f"{path}.{key}" if path else key
                seen.add(key)
            stack.extend((f"{path}.{key}" if path else key, item) for key, item in reversed(node))
        elif isinstance(node, list):
            stack.extend((f"{path}.{i}" if path else str(i), item) for i, item in reversed(list(enumerate(node))))
    return None  # pragma: no cover - the first pass found one


async def check_duplicate_keys(request: Request) -> None:
    """App-wide dependency: a JSON body whose object names a key twice is a 400 naming the key.

    NOTE: Python's parser keeps the last value, so ``{"model": "a", "model": "b"}`` was answered
    as model ``b`` while a proxy, log or policy check that reads the first saw ``a``; RFC 8259
    leaves the meaning open, so the server refuses it as it refuses a query parameter sent twice.
    """
    if getattr(request.scope.get("route"), "body_field", None) is None:
        return
    body = await request.body()
    if not body or not _is_json(request.headers.get("content-type", "application/json")):
        return
    where = duplicate_key(body)
    if where is not None:
        where = clip(where, MAX_PARAM_CHARS)
        raise APIError(400, f"{where}: the same key given twice in one JSON object; send each key once",
                       param=where)


def _is_json(content_type: str) -> bool:
    kind = content_type.split(";", 1)[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


async def check_content_type(request: Request) -> None:
    """App-wide dependency: a body sent to a route that reads JSON, under another (or no)
    ``content-type``, is a 415 naming the header.

    NOTE: FastAPI does not parse such a body as JSON and validates its bytes instead, so the
    answer read "body: Input should be a valid dictionary" however well-formed the JSON was.
    """
    if getattr(request.scope.get("route"), "body_field", None) is None:
        return
    content_type = request.headers.get("content-type", "")
    if _is_json(content_type) or not await request.body():
        return
    got = f"got {content_type[:80]!r}" if content_type else "none was sent"
    raise APIError(415, f"content-type: the body must be JSON sent as application/json ({got})",
                   param="content-type", code="unsupported_media_type")


def _declared_query(route: Any) -> set[str] | None:
    """Names of the query parameters ``route`` (a FastAPI route) reads, None when unknown."""
    dependant = getattr(route, "dependant", None)
    if dependant is None:
        return None
    names: set[str] = set()
    # NOTE: the route's own parameters and those of its dependencies (FastAPI's Dependant tree).
    stack = [dependant]
    while stack:
        node = stack.pop()
        names.update(p.alias for p in node.query_params)
        stack.extend(node.dependencies)
    return names


def undecodable_query(raw: bytes) -> str | None:
    """The name of the first query parameter whose value's %-escapes are not UTF-8, else None.

    NOTE: Starlette decodes them with U+FFFD for each bad byte, so ``?source_id=%FF`` looked up
    ``"\ufffd"`` and answered an empty list instead of an error.

    Example:
        >>> undecodable_query(b"limit=5&source_id=%FF")
        'source_id'
    """
    for pair in raw.split(b"&"):
        name, _, value = pair.partition(b"=")
        for part in (name, value):
            try:
                unquote_to_bytes(part.replace(b"+", b" ")).decode("utf-8")
            except UnicodeDecodeError:
                return unquote_to_bytes(name).decode("utf-8", "replace")[:64] or "query"
    return None


def _takes_body(route: Any) -> bool:
    """Whether ``route`` (a FastAPI route) reads a request body (its own or a dependency's)."""
    stack = [route.dependant]
    while stack:
        node = stack.pop()
        if node.body_params:
            return True
        stack.extend(node.dependencies)
    return False


async def _check_path_and_body(request: Request, route: Any) -> None:
    """A path parameter whose %-escapes are not UTF-8, or a body sent to a route that reads none,
    is a 400 naming it.

    NOTE: the server decodes a bad escape in the path as U+FFFD, so ``/v1/memories/%FF`` looked up
    ``"\ufffd"`` (a 404 about another id) while the same escape in a query was refused; and a body
    sent to ``POST /v1/sessions/{id}/summary`` (or a ``DELETE``) was dropped unread behind a 2xx.
    """
    try:
        unquote_to_bytes(request.scope.get("raw_path") or b"").decode("utf-8")
    except UnicodeDecodeError:
        bad = next((k for k, v in request.path_params.items() if "\ufffd" in str(v)), "path")
        raise APIError(400, f"{bad}: its %-escapes are not UTF-8 text", param=bad) from None
    sent = request.headers.get("content-length", "0").strip() not in ("", "0") or "transfer-encoding" in request.headers
    if sent and getattr(route, "dependant", None) is not None and not _takes_body(route):
        # NOTE: an empty JSON object (what some clients send by default) carries nothing to drop.
        if (await request.body()).strip() not in (b"", b"{}", b"null"):
            raise APIError(400, f"body: {request.method} {route.path} takes no body; send none", param="body")


async def check_query(request: Request) -> None:
    """App-wide dependency: a query parameter sent twice, or one a ``/v1`` route does not read, is
    a 400 naming it; so are a path parameter that is not UTF-8 and a body sent to a route without
    one (:func:`_check_path_and_body`).

    Every parameter of the API is one value; a repeated one was answered with its last value, and
    a misspelt one (``/v1/turns?sessionid=s1``) was dropped, so the answer looked filtered and was
    not.
    """
    params = request.query_params
    route = request.scope.get("route")
    if getattr(route, "include_in_schema", False):
        await _check_path_and_body(request, route)
    if not params or not getattr(route, "include_in_schema", False):
        return  # NOTE: /v1's catch-all (a 404 of its own) and routes outside the API document
    bad = undecodable_query(request.scope.get("query_string", b""))
    if bad is not None:
        bad = clip(bad, MAX_PARAM_CHARS)
        raise APIError(400, f"{bad}: its %-escapes are not UTF-8 text", param=bad)
    for name in params:
        if len(params.getlist(name)) > 1:
            named = clip(name, MAX_PARAM_CHARS)
            raise APIError(400, f"{named}: given {len(params.getlist(name))} times; send it once", param=named)
    if not request.url.path.startswith("/v1/"):
        return
    declared = _declared_query(route)
    unknown = sorted(set(params) - declared) if declared is not None else []
    if unknown:
        known = ", ".join(sorted(declared or ())) or "none"
        # NOTE: the name is the client's text (as long as the server's URL limit): quoted clipped.
        name = clip(unknown[0], MAX_PARAM_CHARS)
        raise APIError(400, f"{name}: unknown query parameter of {clip(request.url.path, MAX_PARAM_CHARS)} "
                            f"(it takes: {known})", param=name)
