"""OpenAI-compatible chat schemas (request, response, stream chunks).

The request accepts the fields the official SDKs send; fields we cannot honour (``n > 1``,
``logprobs``) are rejected with a 400 naming the field rather than silently ignored.
recallserve's own per-request options travel in the standard ``metadata`` object
(``session_id``, ``context_mode``, ``agent``) so any OpenAI client can set them.

An assistant message's echoed ``tool_calls`` are checked to OpenAI's shape (:class:`ToolCall`), and
every tool message must answer a call of the assistant message it follows, each call once (see
:meth:`ChatCompletionRequest._tool_answers`): a malformed history is a 400 naming the field, never
rendered into a prompt as something the model did not say.
"""

from __future__ import annotations

import time
import uuid
from typing import Annotated, Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from recallserve.kernels import CONTROL_CHARS, NoControl, StrictModel, check_json
from recallserve.serve.api._json_schema import schema_problem
from recallserve.serve.api.limits import path_segment_problem
from recallserve.serve.pii import SESSION_KEY_CHARS

__all__ = [
    "TextPart",
    "ImagePart",
    "ImageURL",
    "RefusalPart",
    "JSONSchemaFormat",
    "ToolCall",
    "ToolCallFunction",
    "ChatCompletionMessage",
    "ChatCompletionRequest",
    "ChatCompletionResponse",
    "ChatCompletionChunk",
    "Usage",
    "Choice",
    "ResponseMessage",
    "new_completion_id",
]

MAX_MESSAGES = 1000
MAX_CONTENT_CHARS = 200_000
# NOTE: every image is decoded, described and OCR'd (~0.1-1 s of CPU each): bounded per message.
MAX_IMAGES = 8
# NOTE: every message of a sessionless request is categorised and token-counted to fit the budget
# (~1 s per million characters on one core); the whole conversation is bounded, not only a message.
MAX_TOTAL_CHARS = 1_000_000
MAX_PARTS = 256
MAX_TOTAL_PARTS = 2048
"""NOTE: content parts in one request, all messages together: 1000 messages of 256 parts each (every
one within its own bound) took ~5 s only to validate; an SDK sends one to a few parts a message."""
# NOTE: a 12 MiB image (serve.agent.images.MAX_IMAGE_BYTES) is 16 MiB of base64, plus the
# ``data:image/...;base64,`` head; a longer URL cannot hold an image the describer accepts.
MAX_IMAGE_URL_CHARS = 16 * 2**20 + 256
MAX_TOOL_CALLS = 64
"""NOTE: calls in one assistant message (OpenAI's parallel calls are a handful; the bound predates the shape check)."""
MAX_TOOL_CALL_ID_CHARS = 256
"""NOTE: the bound of a tool message's ``tool_call_id``, which must equal one of these ids."""
MAX_TOOL_NAME_CHARS = 128
"""NOTE: OpenAI's function names are at most 64 characters; twice that lets a history written
against another provider's tools through while still bounding what reaches logs and traces."""
MAX_METADATA_KEYS = 16
"""NOTE: request metadata carries a few recallserve options (session_id, context_mode, agent, reasoning)."""


class ImageURL(StrictModel):
    """An image reference: a ``data:`` URL with base64 content (remote URLs are not fetched)."""

    url: str = Field(min_length=1, max_length=MAX_IMAGE_URL_CHARS, description="data:image/...;base64,... URL (at most 12 MiB of image).")
    detail: Literal["auto", "low", "high"] = Field(default="auto", description="Accepted for compatibility.")


class TextPart(StrictModel):
    """A text content part."""

    type: Literal["text"] = Field(description="Part type.")
    text: str = Field(max_length=MAX_CONTENT_CHARS, description="The text.")


class ImagePart(StrictModel):
    """An image content part."""

    type: Literal["image_url"] = Field(description="Part type.")
    image_url: ImageURL = Field(description="The image.")


class RefusalPart(StrictModel):
    """An assistant's refusal content part (OpenAI's ``{"type": "refusal", "refusal": ...}``).

    NOTE: openai-python's assistant message type takes text and refusal parts; a refusal part was
    a 400 here, so a history the SDK types allow was refused. Assistant messages only.
    """

    type: Literal["refusal"] = Field(description="Part type.")
    refusal: str = Field(max_length=MAX_CONTENT_CHARS, description="The refusal text.")


class ToolCallFunction(StrictModel):
    """The function a tool call names, and its arguments as the model wrote them.

    ``arguments`` must be a string but need not parse as JSON: the OpenAI API accepts any string
    here (a model can write broken JSON, and the client echoes what it got), and this server only
    renders the history, never runs the call. An object or a number in its place is a 400: the
    SDKs always send the string, so anything else is a client bug worth naming.
    """

    name: Annotated[str, NoControl] = Field(min_length=1, max_length=MAX_TOOL_NAME_CHARS,
                                            description="The function called (no control characters).")
    arguments: str = Field(max_length=MAX_CONTENT_CHARS, description="Its arguments, a string (usually JSON).")


class ToolCall(StrictModel):
    """One call of an assistant message: OpenAI's ``{"id", "type": "function", "function"}``.

    Only ``type: "function"`` exists for chat completions here (client tools are refused, see
    ``ChatCompletionRequest.tools``), so an unknown type or key is a 400 naming it.
    """

    id: Annotated[str, NoControl] = Field(min_length=1, max_length=MAX_TOOL_CALL_ID_CHARS,
                                          description="The call's id; a tool message answers it by this id.")
    type: Literal["function"] = Field(description="Call type (only 'function').")
    function: ToolCallFunction = Field(description="The function called and its arguments.")


class ChatCompletionMessage(StrictModel):
    """One input message."""

    role: Literal["system", "developer", "user", "assistant", "tool"] = Field(description="Author role.")
    content: str | list[TextPart | ImagePart | RefusalPart] | None = Field(
        default=None, description=f"Text or content parts (at most {MAX_PARTS} parts, {MAX_IMAGES} images).")
    name: Annotated[str | None, NoControl] = Field(default=None, min_length=1, max_length=64, description="Optional author name.")
    tool_call_id: Annotated[str | None, NoControl] = Field(default=None, max_length=MAX_TOOL_CALL_ID_CHARS,
                                                           description="For role=tool: the id of the call answered.")
    tool_calls: list[ToolCall] | None = Field(default=None, max_length=MAX_TOOL_CALLS,
                                              description="Assistant tool calls (echoed history).")
    # NOTE: the fields an OpenAI response's message carries besides these (openai-python sends them back
    # when a client appends ``completion.choices[0].message`` to its history): accepted on an assistant
    # message, checked for size, and not rendered, except a refusal, which stands for a null content.
    refusal: str | None = Field(default=None, max_length=MAX_CONTENT_CHARS,
                                description="Assistant only: the refusal text of an echoed OpenAI reply.")
    annotations: list[dict[str, Any]] | None = Field(default=None, max_length=64,
                                                     description="Assistant only: an echoed reply's annotations (ignored).")
    audio: dict[str, Any] | None = Field(default=None, description="Assistant only: an echoed reply's audio reference (ignored).")
    function_call: Any = Field(default=None, description="Deprecated by OpenAI; only null is accepted (send tool_calls).")

    @field_validator("function_call")
    @classmethod
    def _no_function_call(cls, v: Any) -> None:
        if v is not None:
            raise ValueError("function_call is OpenAI's deprecated form of a call; send the call in tool_calls")
        return None

    @field_validator("annotations", "audio")
    @classmethod
    def _echo_size(cls, v: Any, info: Any) -> Any:
        return None if v is None else check_json(v, info.field_name, max_depth=4, max_items=64, max_chars=8192)

    @field_validator("content")
    @classmethod
    def _content_size(cls, v: str | list[TextPart | ImagePart | RefusalPart] | None
                      ) -> str | list[TextPart | ImagePart | RefusalPart] | None:
        if isinstance(v, str) and len(v) > MAX_CONTENT_CHARS:
            raise ValueError(f"content is longer than {MAX_CONTENT_CHARS} characters")
        if isinstance(v, list):
            if not v:
                raise ValueError("content is an empty list of parts; send a string or at least one part")
            if len(v) > MAX_PARTS:
                raise ValueError(f"content has {len(v)} parts; at most {MAX_PARTS} are accepted")
            images = sum(isinstance(p, ImagePart) for p in v)
            if images > MAX_IMAGES:
                raise ValueError(f"content has {images} images; at most {MAX_IMAGES} per message are accepted")
        return v

    @model_validator(mode="after")
    def _fits_role(self) -> ChatCompletionMessage:
        # NOTE: each of these was dropped or passed on silently: a null user message was an empty
        # question, an image in an assistant or system message was never looked at.
        if self.content is None and self.role != "assistant":
            raise ValueError(f"content: required in a {self.role} message (null only in an assistant's)")
        if self.role != "assistant" and isinstance(self.content, list) and any(isinstance(p, RefusalPart) for p in self.content):
            raise ValueError(f"content: a refusal part is an assistant's, not a {self.role} message's")
        if self.role != "user" and self.images():
            raise ValueError(f"content: image parts are accepted in user messages only, not in a {self.role} message")
        if self.role == "tool" and self.tool_call_id is None:
            raise ValueError("tool_call_id: required in a tool message (the id of the call it answers)")
        if self.role != "tool" and self.tool_call_id is not None:
            raise ValueError(f"tool_call_id: only a tool message answers a call, not a {self.role} message")
        if self.role != "assistant" and self.tool_calls is not None:
            raise ValueError(f"tool_calls: only an assistant message makes tool calls, not a {self.role} message")
        for echoed in ("refusal", "annotations", "audio"):
            if self.role != "assistant" and getattr(self, echoed) is not None:
                raise ValueError(f"{echoed}: only an assistant message (an echoed reply) carries it, not a {self.role} message")
        if self.tool_calls is not None and not self.tool_calls:
            # NOTE: OpenAI refuses it ("empty array"); it was rendered as a turn that made no call.
            raise ValueError("tool_calls: an empty array; leave tool_calls out when the message made no call")
        if (self.role == "assistant" and self.content is None and not self.tool_calls
                and self.refusal is None and self.audio is None):
            # NOTE: OpenAI: content is "required unless tool_calls or function_call is specified"
            # (a refusal or an audio reply echoed stand for it); it was rendered as nothing at all.
            raise ValueError("content: required in an assistant message without tool_calls (null only with calls, "
                             "a refusal or an audio reply)")
        seen: set[str] = set()
        for i, call in enumerate(self.tool_calls or []):
            # NOTE: a tool message answers a call by its id: two calls of one message with one id
            # make the answer ambiguous (OpenAI's ids are unique; a model never repeats one in a message).
            if call.id in seen:
                raise ValueError(f"tool_calls.{i}.id: {call.id[:80]!r} is the id of an earlier call of this message")
            seen.add(call.id)
        return self

    def text(self) -> str:
        """The text of the message (text and refusal parts joined; images excluded; an echoed refusal for a null content)."""
        if self.content is None:
            return self.refusal or ""
        if isinstance(self.content, str):
            return self.content
        return "\n".join(p.text if isinstance(p, TextPart) else p.refusal for p in self.content
                         if not isinstance(p, ImagePart))

    def history_text(self) -> str:
        """The message as the model reads it in the history: its text, then an assistant's calls one a
        line (``[call <id>] <name>(<arguments>)``); a tool answer headed by the id of the call it answers.

        NOTE: the history was each message's text only: a call's function and arguments never
        reached the model, so of two answers ("18 C", "24 C") to two calls (Paris, Rome) it could
        not tell which city was which.
        """
        text = self.text()
        if self.tool_calls:
            calls = "\n".join(f"[call {c.id}] {c.function.name}({c.function.arguments})" for c in self.tool_calls)
            return f"{text}\n{calls}" if text.strip() else calls
        if self.role == "tool":
            return f"[result of call {self.tool_call_id}] {text}"
        return text

    def images(self) -> list[str]:
        """The image URLs of the message."""
        if not isinstance(self.content, list):
            return []
        return [p.image_url.url for p in self.content if isinstance(p, ImagePart)]


class StreamOptions(StrictModel):
    """OpenAI stream options."""

    include_usage: bool = Field(strict=True, default=False, description="Send a last chunk with token usage.")


class JSONSchemaFormat(StrictModel):
    """OpenAI's ``response_format.json_schema``: ``{name, description, schema, strict}``.

    NOTE: it was a free-form object: a schema of the wrong shape failed inside the engine's grammar
    compiler (a 503 engine error, or an error event mid-stream), an unknown key or a missing name
    was ignored. Now each is a 400 naming its path (:func:`recallserve.serve.api._json_schema.schema_problem`).
    """

    name: str = Field(min_length=1, max_length=64, pattern=r"^[a-zA-Z0-9_-]+$",
                      description="The format's name (OpenAI's rule: a-z, A-Z, 0-9, _ and -, at most 64).")
    description: str | None = Field(default=None, max_length=1024, description="What the format is for.")
    schema_: dict[str, Any] | None = Field(default=None, alias="schema", description="The JSON Schema of the reply (an object).")
    strict: bool | None = Field(strict=True, default=None, description="Accepted (the engine always follows the schema).")

    @field_validator("schema_")
    @classmethod
    def _schema_shape(cls, v: dict[str, Any] | None) -> dict[str, Any] | None:
        if v is None:
            return None
        # NOTE: a schema is compiled into a grammar per request: deep or wide ones cost the engine.
        check_json(v, "schema", max_depth=11, max_items=256, max_chars=8192)
        if (problem := schema_problem(v)) is not None:
            raise ValueError(f"not a valid JSON Schema: {problem}")
        return v


class ResponseFormat(StrictModel):
    """OpenAI response_format: text, json_object or json_schema."""

    type: Literal["text", "json_object", "json_schema"] = Field(description="Output format.")
    json_schema: JSONSchemaFormat | None = Field(default=None, description="{name, schema, strict} for type=json_schema.")

    @model_validator(mode="after")
    def _schema_with_its_type(self) -> ResponseFormat:
        if self.json_schema is not None and self.type != "json_schema":
            raise ValueError(f"json_schema: only with type 'json_schema' (it would be ignored with {self.type!r})")
        return self


class ChatCompletionRequest(StrictModel):
    """``POST /v1/chat/completions`` body."""

    model: str = Field(min_length=1, max_length=256, description="Model name (see GET /v1/models).")
    messages: list[ChatCompletionMessage] = Field(min_length=1, max_length=MAX_MESSAGES, description="The conversation.")
    max_tokens: int | None = Field(strict=True, default=None, ge=1, description="Most tokens to generate.")
    max_completion_tokens: int | None = Field(strict=True, default=None, ge=1, description="Alias of max_tokens (newer SDKs).")
    temperature: float | None = Field(strict=True, default=None, ge=0, le=2, description="Sampling temperature.")
    top_p: float | None = Field(strict=True, default=None, gt=0, le=1, description="Nucleus sampling mass.")
    n: int | None = Field(strict=True, default=None, ge=1, le=1, description="Only 1 choice is supported.")
    stream: bool = Field(strict=True, default=False, description="Stream the answer as server-sent events.")
    stream_options: StreamOptions | None = Field(default=None, description="Streaming options.")
    stop: Annotated[str, Field(min_length=1, max_length=256)] | list[Annotated[str, Field(min_length=1, max_length=256)]] | None = Field(
        default=None, description="Stop sequences (at most 4, 1-256 characters each).")
    seed: int | None = Field(strict=True, default=None, ge=-(2**63), le=2**63 - 1, description="Sampling seed (64-bit).")
    user: str | None = Field(default=None, min_length=1, max_length=256, description="End-user id; sessions and memories are per user.")
    metadata: dict[Annotated[str, Field(min_length=1, max_length=64), NoControl], Annotated[str, Field(max_length=256)]] | None = Field(
        default=None, max_length=MAX_METADATA_KEYS,
        description="recallserve options: session_id, context_mode, agent (auto|on|off), reasoning.")
    response_format: ResponseFormat | None = Field(default=None, description="Constrain the output format.")
    presence_penalty: float | None = Field(strict=True, default=None, ge=-2, le=2, description="Lowers the logit of every token already used (OpenAI's definition).")
    frequency_penalty: float | None = Field(strict=True, default=None, ge=-2, le=2, description="Lowers a token's logit in proportion to its uses so far.")
    logprobs: bool | None = Field(strict=True, default=None, description="Not supported: must be false or absent.")
    top_logprobs: int | None = Field(strict=True, default=None, description="Not supported.")
    logit_bias: dict[str, float] | None = Field(default=None, max_length=1, description="Not supported.")
    tools: list[dict[str, Any]] | None = Field(default=None, max_length=1, description="Not supported: tools are server-side.")
    tool_choice: Annotated[str, Field(max_length=64)] | dict[str, Any] | None = Field(
        default=None, description="Only 'auto' or 'none' (the server's tools do not run: metadata.agent off).")
    parallel_tool_calls: bool | None = Field(strict=True, default=None, description="Accepted for compatibility.")
    store: bool | None = Field(strict=True, default=None, description="Accepted for compatibility.")
    service_tier: Literal["auto", "default", "flex", "scale", "priority"] | None = Field(
        default=None, description="Accepted for compatibility (OpenAI's tiers).")

    @field_validator("tool_choice")
    @classmethod
    def _tool_choice_size(cls, v: str | dict[str, Any] | None) -> str | dict[str, Any] | None:
        return check_json(v, "tool_choice", max_depth=3, max_items=8, max_chars=256) if isinstance(v, dict) else v

    @model_validator(mode="before")
    @classmethod
    def _count_parts(cls, data: Any) -> Any:
        # NOTE: counted on the raw body, before the parts are validated one by one (the cost bounded).
        if isinstance(data, dict) and isinstance(data.get("messages"), list):
            total = sum(len(m["content"]) for m in data["messages"]
                        if isinstance(m, dict) and isinstance(m.get("content"), list))
            if total > MAX_TOTAL_PARTS:
                raise ValueError(f"messages: {total} content parts in all; at most {MAX_TOTAL_PARTS} per request "
                                 "(join a message's text parts into one string)")
        return data

    def penalties(self) -> dict[str, float]:
        """``presence_penalty`` / ``frequency_penalty`` as sent (absent or null: not in the dict, i.e. 0)."""
        return {name: value for name in ("presence_penalty", "frequency_penalty")
                if (value := getattr(self, name)) is not None}

    @model_validator(mode="after")
    def _unsupported(self) -> ChatCompletionRequest:
        if self.logprobs:
            raise ValueError("logprobs: not supported by this server")
        if self.top_logprobs:
            raise ValueError("top_logprobs: not supported by this server")
        if self.logit_bias:
            raise ValueError("logit_bias: not supported by this server")
        if self.tools:
            raise ValueError("tools: client-side tools are not supported; tools run server-side in the agent loop")
        # NOTE: "required", "none"-like spellings and {"type": "function", ...} ask for client tools,
        # which this server has none of: refused, not ignored (the answer would not be what was asked).
        if self.tool_choice is not None and self.tool_choice not in ("none", "auto"):
            raise ValueError(f"tool_choice: only 'none' or 'auto' are accepted (tools run server-side), "
                             f"got {str(self.tool_choice)[:80]!r}")
        if (self.max_tokens is not None and self.max_completion_tokens is not None
                and self.max_tokens != self.max_completion_tokens):
            raise ValueError(f"max_completion_tokens: {self.max_completion_tokens} differs from max_tokens "
                             f"{self.max_tokens} (the same budget); send one of them")
        if self.stream_options is not None and not self.stream:
            raise ValueError("stream_options: only allowed with stream: true")
        if isinstance(self.stop, list) and len(self.stop) > 4:
            raise ValueError("stop: at most 4 stop sequences")
        if not any(m.role == "user" for m in self.messages):
            raise ValueError("messages: at least one message with role 'user' is required")
        total = sum(len(m.history_text()) for m in self.messages)
        if total > MAX_TOTAL_CHARS:
            raise ValueError(f"messages: {total} characters of text in all; at most {MAX_TOTAL_CHARS} are accepted "
                             "(send long histories as a session, metadata.session_id)")
        meta = self.metadata or {}
        session_id = meta.get("session_id")
        if session_id is not None and not session_id.strip():
            raise ValueError("metadata.session_id: must not be empty (leave it out for a sessionless turn)")
        if session_id is not None and len(session_id) > SESSION_KEY_CHARS:
            # NOTE: the bound of GET /v1/sessions/{session_id} and /v1/turns?session_id=: a longer id
            # holding personal data was masked to a key that fits and answered, then could not be read.
            raise ValueError(f"metadata.session_id: at most {SESSION_KEY_CHARS} characters, got {len(session_id)}")
        if session_id is not None and (problem := path_segment_problem(session_id)) is not None:
            # NOTE: the id of GET /v1/sessions/{session_id}: a turn stored under it was answered 200
            # and its session could never be read.
            raise ValueError(f"metadata.session_id: {problem}")
        for name, value in (("user", self.user), ("metadata.session_id", session_id)):
            if value is not None and CONTROL_CHARS.search(value):
                # NOTE: ids key the session store and are written to logs and traces: a newline
                # or NUL in one forges a log line or splits a key.
                raise ValueError(f"{name}: must not hold control characters (U+0000-U+001F, U+007F)")
        mode = meta.get("context_mode")
        if mode is not None and mode not in {"auto", "full", "sliding", "summary", "retrieval", "hybrid"}:
            raise ValueError(f"metadata.context_mode: unknown mode {mode!r}")
        agent = meta.get("agent")
        if agent is not None and agent not in {"auto", "on", "off"}:
            raise ValueError(f"metadata.agent: must be auto, on or off, got {agent!r}")
        reasoning = meta.get("reasoning")
        if reasoning is not None and reasoning not in {"default", "segmented"}:
            raise ValueError(f"metadata.reasoning: must be default or segmented, got {reasoning!r}")
        # NOTE: stop sequences and a response format are the client's own protocol, applied to a
        # plain answer (metadata.agent auto then answers without the loop); the agent's steps and
        # the segmented format are JSON / sections of their own, which either would cut or fight:
        # asked for together, one of the two was dropped in silence.
        json_format = self.response_format is not None and self.response_format.type != "text"
        for field, given in (("response_format", json_format), ("stop", bool(self.stop_list()))):
            if given and agent == "on":
                raise ValueError(f"{field}: not applied by the agent loop (metadata.agent: on); send metadata.agent "
                                 "auto or off")
            if given and reasoning == "segmented":
                raise ValueError(f"{field}: not applied by segmented reasoning (metadata.reasoning: segmented)")
        if self.tool_choice == "none" and agent == "on":
            # NOTE: "none" asks that no tool be called; the server's tools then do not run (metadata.agent off).
            raise ValueError("tool_choice: 'none' (no tool calls) contradicts metadata.agent: on (always the tool loop)")
        return self

    @model_validator(mode="after")
    def _tool_answers(self) -> ChatCompletionRequest:
        """Every call of an assistant message is answered, once, by the tool messages right after it.

        OpenAI's rules, each a 400 here too: a tool message must follow an assistant message with
        ``tool_calls`` (only other tool messages between) and answer one of its calls
        (``messages.<i>.tool_call_id``); and "an assistant message with 'tool_calls' must be
        followed by tool messages responding to each 'tool_call_id'" (``messages.<i>.tool_calls``,
        the assistant message's index). A call answered twice is refused as well: the model would
        see two results of one call. Anything the OpenAI API accepts still passes (the SDK's
        ``assistant(tool_calls) -> tool, tool -> ...`` history, answers in any order).

        NOTE: the same in session mode (``metadata.session_id``): a session stores the turns' text,
        never their tool calls, so a call made in an earlier request is not known here; the
        assistant message that made the calls travels with the tool messages that answer them,
        as it does with OpenAI. Ids may repeat across assistant messages (some servers number
        their calls ``call_0``, ``call_1``, ... per turn): an answer matches the calls just before it.
        """
        calls: set[str] | None = None  # ids of the calls a tool message here may answer; None: none may
        unanswered: list[str] = []  # ids of those calls no tool message has answered yet, in order
        made_at = -1  # index of the assistant message that made them
        for i, m in enumerate([*self.messages, None]):
            if m is not None and m.role == "tool":
                if calls is None:
                    raise ValueError(f"messages.{i}.tool_call_id: a tool message must answer a call of the assistant "
                                     "message before it (only tool messages between), and none precedes it")
                if m.tool_call_id not in calls:
                    raise ValueError(f"messages.{i}.tool_call_id: {str(m.tool_call_id)[:80]!r} is not the id of a "
                                     "call of the assistant message before it")
                if m.tool_call_id not in unanswered:
                    raise ValueError(f"messages.{i}.tool_call_id: {str(m.tool_call_id)[:80]!r} was already answered "
                                     "by an earlier tool message (one answer per call)")
                unanswered.remove(m.tool_call_id)
                continue
            if unanswered:
                raise ValueError(f"messages.{made_at}.tool_calls: an assistant message with tool_calls must be followed "
                                 f"by tool messages answering each call; {unanswered[0][:80]!r} has no answer"
                                 + (f" (nor {len(unanswered) - 1} more)" if len(unanswered) > 1 else ""))
            if m is not None and m.role == "assistant" and m.tool_calls:
                calls, unanswered, made_at = {c.id for c in m.tool_calls}, [c.id for c in m.tool_calls], i
            else:
                calls = None
        return self

    def constrains_output(self) -> bool:
        """Whether the client set its own output protocol: stop sequences, or a JSON response format.

        NOTE: ``{"type": "text"}`` is the default format, no constraint: it turned the agent (and
        segmented reasoning) off in silence, as a JSON format rightly does.
        """
        return bool(self.stop_list()) or (self.response_format is not None and self.response_format.type != "text")

    def stop_list(self) -> list[str]:
        """Stop sequences as a list."""
        if self.stop is None:
            return []
        return [self.stop] if isinstance(self.stop, str) else list(self.stop)

    def requested_max_tokens(self) -> int | None:
        """max_completion_tokens, else max_tokens."""
        return self.max_completion_tokens or self.max_tokens

    def max_tokens_param(self) -> str:
        """The field the client set the token budget with (the one an error about it names)."""
        return "max_completion_tokens" if self.max_completion_tokens is not None else "max_tokens"


class _Open(BaseModel):
    """Response models: built by us, serialised as-is."""

    model_config = ConfigDict(extra="forbid")


class PromptTokensDetails(_Open):
    """OpenAI's ``usage.prompt_tokens_details``: prompt tokens the engine reused from its prefix cache."""

    cached_tokens: int = 0


class Usage(_Open):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | None = None


class ResponseMessage(_Open):
    role: Literal["assistant"] = "assistant"
    content: str | None = None


class Choice(_Open):
    index: int = 0
    message: ResponseMessage
    finish_reason: Literal["stop", "length"] | None
    logprobs: None = None


def new_completion_id() -> str:
    """A fresh ``chatcmpl-...`` id."""
    return f"chatcmpl-{uuid.uuid4().hex}"


class ChatCompletionResponse(_Open):
    id: str = Field(default_factory=new_completion_id)
    object: Literal["chat.completion"] = "chat.completion"
    created: int = Field(default_factory=lambda: int(time.time()))
    model: str
    choices: list[Choice]
    usage: Usage
    recallserve: dict[str, Any] = Field(default_factory=dict, description="Pipeline metadata (memories, context, agent).")


class DeltaMessage(_Open):
    role: Literal["assistant"] | None = None
    content: str | None = None


class ChunkChoice(_Open):
    index: int = 0
    delta: DeltaMessage
    finish_reason: Literal["stop", "length"] | None = None
    logprobs: None = None


class ChatCompletionChunk(_Open):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    choices: list[ChunkChoice]
    usage: Usage | None = None
    recallserve: dict[str, Any] | None = None
