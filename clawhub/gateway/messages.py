"""Anthropic's Messages API (``POST /v1/messages``, what Claude Code speaks) on top of the chat route.

A Messages request is translated into a chat completions request and served by exactly the chat path:
admission, quotas, adapter routing, output clamping, calls only to declared tools, and capture. vLLM serves a
``/v1/messages`` of its own, but it translates to chat completions inside the server the same way and cannot
return the sampled token ids or their log-probs; served through chat, the turn comes back with both, so the
trainer's sample is the served sequence and capture, sessions and next-state linking need no second shape (a
Claude Code request that resends the history translates to chat messages that extend the earlier turn's).
The translation follows vLLM's own (``vllm/entrypoints/anthropic/serving.py``), so the prompt the model sees
is the one vLLM's route would have rendered.

    chat_body = to_chat(body)            # the request, refused (400) where it cannot be served
    message = to_message(chat_reply)     # a whole reply
    frames = MessageFrames(...)          # a stream: chat chunks in, Anthropic SSE events out

Errors a Messages client sees are Anthropic-shaped: ``{"type": "error", "error": {"type", "message"}}``.
"""

from __future__ import annotations

import orjson

from clawhub.gateway import tool_calls
from clawhub.gateway.errors import GatewayError, bad_request
from clawhub.gateway.translated import chat_function, pass_through
from clawhub.gateway.translated import refuse as _refuse

PATH = "/v1/messages"
COUNT_TOKENS_PATH = "/v1/messages/count_tokens"
# Claude Code puts an attribution line with a per-request hash first in its system prompt: left in, it would
# make every request's prompt differ (no prefix caching, no continuation hash matching the previous turn).
_BILLING_HEADER = "x-anthropic-billing-header"
_TITLE_PROMPT = "You are naming a coding session"
_QUOTA_MESSAGES = [{"role": "user", "content": "quota"}]
_STOP_REASONS = {"stop": "end_turn", "length": "max_tokens", "tool_calls": "tool_use"}
_ERROR_TYPES = {400: "invalid_request_error", 401: "authentication_error", 403: "permission_error",
                404: "not_found_error", 405: "invalid_request_error", 413: "request_too_large",
                429: "rate_limit_error", 503: "overloaded_error"}


# --- errors -------------------------------------------------------------------------------------------------
def error_payload(err: GatewayError) -> dict:
    kind = _ERROR_TYPES.get(err.status, "api_error" if err.status >= 500 else "invalid_request_error")
    return {"type": "error", "error": {"type": kind, "message": err.message}}


def error_body(err: GatewayError) -> bytes:
    return orjson.dumps(error_payload(err))


# --- request ------------------------------------------------------------------------------------------------
def _text_of(blocks, param: str) -> str:
    """The text of a system prompt or tool result given as a string or a list of text blocks."""
    if isinstance(blocks, str):
        return blocks
    if not isinstance(blocks, list):
        raise _refuse(f"'{param}' must be a string or a list of content blocks.", param)
    parts = []
    for block in blocks:
        if not isinstance(block, dict) or not isinstance(block.get("type"), str):
            raise _refuse(f"Every block in '{param}' must be an object with a 'type'.", param)
        if block["type"] == "text":
            text = block.get("text")
            if not isinstance(text, str):
                raise _refuse(f"A text block in '{param}' needs 'text' (a string).", param)
            parts.append(text)
    return "".join(parts)


def _system(body: dict) -> str:
    system = body.get("system")
    if system is None:
        return ""
    if isinstance(system, list):
        system = [b for b in system if not (isinstance(b, dict) and str(b.get("text", "")).startswith(
            _BILLING_HEADER))]
    return _text_of(system, "system")


def _image_url(source) -> str:
    if not isinstance(source, dict):
        raise _refuse("An image block needs a 'source' object.", "messages")
    if source.get("type") == "url" and isinstance(source.get("url"), str):
        return source["url"]
    if source.get("type") == "base64" and isinstance(source.get("data"), str):
        return f"data:{source.get('media_type') or 'image/jpeg'};base64,{source['data']}"
    raise _refuse("An image 'source' must be {type: base64, media_type, data} or {type: url, url}.",
                  "messages")


def _tool_result(block: dict) -> list[dict]:
    """A user's tool_result block: a tool message answering the call (and its images as a user message)."""
    content = block.get("content")
    texts, images = [], []
    if isinstance(content, list):
        for item in content:
            if isinstance(item, dict) and item.get("type") == "text" and isinstance(item.get("text"), str):
                texts.append(item["text"])
            elif isinstance(item, dict) and item.get("type") == "image":
                images.append({"type": "image_url", "image_url": {"url": _image_url(item.get("source"))}})
        text = "\n".join(texts)
    elif content is None or isinstance(content, str):
        text = content or ""
    else:
        raise _refuse("A tool_result's 'content' must be a string or a list of blocks.", "messages")
    tool_use_id = block.get("tool_use_id")
    if not isinstance(tool_use_id, str) or not tool_use_id:
        raise _refuse("A tool_result block needs 'tool_use_id' (a string).", "messages")
    out = [{"role": "tool", "tool_call_id": tool_use_id, "content": text}]
    if images:
        out.append({"role": "user", "content": images})
    return out


def _tool_use(block: dict) -> dict:
    name, call_id, arguments = block.get("name"), block.get("id"), block.get("input", {})
    if not isinstance(name, str) or not name or not isinstance(call_id, str) or not call_id:
        raise _refuse("A tool_use block needs 'id' and 'name' (strings).", "messages")
    if not isinstance(arguments, dict):
        raise _refuse("A tool_use block's 'input' must be an object.", "messages")
    return {"id": call_id, "type": "function",
            "function": {"name": name, "arguments": orjson.dumps(arguments).decode()}}


def _message(message, out: list[dict]) -> None:
    """One Messages message, appended to ``out`` as chat messages (tool results become tool messages)."""
    if not isinstance(message, dict):
        raise _refuse("Every message must be an object.", "messages")
    role, content = message.get("role"), message.get("content")
    if role not in ("user", "assistant", "system"):
        raise _refuse("A message's 'role' must be 'user' or 'assistant'.", "messages")
    if role == "system":
        text = _text_of(content, "messages")
        if text and not text.startswith(_BILLING_HEADER):
            out.append({"role": "system", "content": text})
        return
    if isinstance(content, str):
        out.append({"role": role, "content": content})
        return
    if not isinstance(content, list):
        raise _refuse("A message's 'content' must be a string or a list of content blocks.", "messages")
    parts: list[dict] = []
    calls: list[dict] = []
    reasoning: list[str] = []
    for block in content:
        kind = block.get("type") if isinstance(block, dict) else None
        if not isinstance(kind, str):
            raise _refuse("Every content block must be an object with a 'type' (a string).", "messages")
        if kind == "text":
            if not isinstance(block.get("text"), str):
                raise _refuse("A text block needs 'text' (a string).", "messages")
            if block["text"]:
                parts.append({"type": "text", "text": block["text"]})
        elif kind == "image":
            parts.append({"type": "image_url", "image_url": {"url": _image_url(block.get("source"))}})
        elif kind == "thinking":
            if isinstance(block.get("thinking"), str):
                reasoning.append(block["thinking"])
        elif kind == "redacted_thinking":
            pass  # opaque: nothing the model could read
        elif kind == "tool_use" and role == "assistant":
            calls.append(_tool_use(block))
        elif kind == "tool_result" and role == "user":
            out.extend(_tool_result(block))
        else:
            article = "an" if role == "assistant" else "a"
            raise _refuse(f"Content blocks of type {kind!r} are not supported in {article} {role} message.",
                          "messages")
    chat: dict = {"role": role}
    if parts:
        chat["content"] = parts[0]["text"] if len(parts) == 1 and parts[0]["type"] == "text" else parts
    if calls:
        chat["tool_calls"] = calls
    if reasoning:
        chat["reasoning"] = "".join(reasoning)
    if role == "assistant" or parts:
        out.append(chat)


def _tools(tools) -> list[dict]:
    if not isinstance(tools, list):
        raise _refuse("'tools' must be a list.", "tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _refuse("Every tool must be an object with a 'name'.", "tools")
        if tool.get("type") not in (None, "custom") and "input_schema" not in tool:
            # Anthropic's server tools (web search, code execution…) run on Anthropic's servers: nothing
            # here can run them, so the model is not offered them.
            continue
        out.append(chat_function(tool, tool.get("input_schema", {"type": "object", "properties": {}}),
                                 "input_schema"))
    return out


def _tool_choice(choice, chat: dict) -> None:
    if not isinstance(choice, dict) or choice.get("type") not in ("auto", "any", "tool", "none"):
        raise _refuse("'tool_choice' must be {type: auto | any | tool | none}.", "tool_choice")
    kind = choice["type"]
    if kind == "tool":
        if not isinstance(choice.get("name"), str):
            raise _refuse("'tool_choice' of type 'tool' needs 'name'.", "tool_choice")
        chat["tool_choice"] = {"type": "function", "function": {"name": choice["name"]}}
    else:
        chat["tool_choice"] = {"auto": "auto", "any": "required", "none": "none"}[kind]
    if choice.get("disable_parallel_tool_use") is True:
        chat["parallel_tool_calls"] = False


def _check_number(body: dict, name: str, *, integer: bool = False) -> None:
    value = body.get(name)
    if value is None:
        return
    ok = isinstance(value, int) if integer else isinstance(value, int | float)
    if not ok or isinstance(value, bool):
        raise _refuse(f"'{name}' must be {'an integer' if integer else 'a number'}.", name)


def _response_format(config) -> dict | None:
    """Structured output: ``output_config.format`` {type: json_schema, schema} as the chat route's
    ``response_format`` (vLLM constrains the reply to the schema). Claude Code asks for its session titles so.
    Anything else in ``output_config`` (``effort``) has no counterpart here and is left out."""
    form = config.get("format") if isinstance(config, dict) else None
    if not isinstance(form, dict) or form.get("type") != "json_schema":
        return None
    if not isinstance(form.get("schema"), dict):
        raise _refuse("'output_config.format' of type json_schema needs 'schema' (an object).",
                      "output_config")
    return {"type": "json_schema", "json_schema": {"name": "output", "schema": form["schema"]}}


def to_chat(body, *, count_only: bool = False) -> dict:
    """The chat completions request that serves Messages request ``body``; 400 where it cannot be served.
    ``count_only``: a count_tokens body (no ``max_tokens``, nothing sampled)."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _refuse("'model' is required (a string).", "model")
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _refuse("'messages' must be a non-empty list.", "messages")
    chat_messages: list[dict] = []
    system = _system(body)
    if system:
        chat_messages.append({"role": "system", "content": system})
    for message in messages:
        _message(message, chat_messages)
    if not chat_messages:
        raise _refuse("'messages' holds nothing to answer.", "messages")
    chat: dict = {"model": model, "messages": chat_messages}
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        _tool_choice(body["tool_choice"], chat)
    if count_only:
        return chat
    max_tokens = body.get("max_tokens")
    if not isinstance(max_tokens, int) or isinstance(max_tokens, bool) or max_tokens < 1:
        raise _refuse("'max_tokens' is required (a positive integer).", "max_tokens")
    chat["max_tokens"] = max_tokens
    for name in ("temperature", "top_p"):
        _check_number(body, name)
        if body.get(name) is not None:
            chat[name] = body[name]
    _check_number(body, "top_k", integer=True)
    if body.get("top_k") is not None:
        chat["top_k"] = body["top_k"]
    response_format = _response_format(body.get("output_config"))
    if response_format is not None:
        chat["response_format"] = response_format
    stops = body.get("stop_sequences")
    if stops is not None:
        if not isinstance(stops, list) or not all(isinstance(s, str) for s in stops):
            raise _refuse("'stop_sequences' must be a list of strings.", "stop_sequences")
        if stops:
            chat["stop"] = stops
    return pass_through(body, chat)


def client_session_id(headers: dict[bytes, bytes], body: dict) -> str | None:
    """Claude Code's own session id: the ``X-Claude-Code-Session-Id`` header (2.1.86 on), else the
    ``session_id`` in ``metadata.user_id`` (a JSON string since 2.1.78, ``user_…_session_<uuid>`` before)."""
    header = headers.get(b"x-claude-code-session-id")
    if header and header.strip():
        return header.strip().decode("latin-1")
    metadata = body.get("metadata") if isinstance(body, dict) else None
    user_id = metadata.get("user_id") if isinstance(metadata, dict) else None
    if not isinstance(user_id, str) or not user_id:
        return None
    if user_id.startswith("{"):
        try:
            parsed = orjson.loads(user_id)
        except orjson.JSONDecodeError:
            return None
        session = parsed.get("session_id") if isinstance(parsed, dict) else None
        return session if isinstance(session, str) and session else None
    _, found, session = user_id.rpartition("_session_")
    return session if found and session else None


def side_kind(body: dict) -> str | None:
    """Which of Claude Code's side requests ``body`` is, by its shape; None for a turn of the conversation.
    Each is an extra call beside the conversation (on the model it uses for background work, which the key
    page points at the tenant's adapter too), not a reply to the user: served and stored as a side turn, so it
    is neither a main turn nor anyone's next state, and never trained on.
    - title: Claude Code (2.1.332, interactive) names the session before each new user message: a system
      block "You are naming a coding session…" and one user message holding the user's text in <session>;
    - quota_probe: its rate-limit check, one user message "quota" with max_tokens 1 (in its code, not seen
      against ClawHub: it is made for Claude subscription accounts)."""
    system = body.get("system")
    if isinstance(system, list):
        for block in system:
            text = block.get("text") if isinstance(block, dict) else None
            if isinstance(text, str) and text.startswith(_TITLE_PROMPT):
                return "title"
    if body.get("max_tokens") == 1 and body.get("messages") == _QUOTA_MESSAGES:
        return "quota_probe"
    return None


# --- response -----------------------------------------------------------------------------------------------
def _stop_reason(finish_reason: str | None, stop_reason, tool_used: bool) -> tuple[str | None, str | None]:
    if finish_reason == "length":
        return "max_tokens", None
    if tool_used:
        return "tool_use", None
    if finish_reason == "stop" and isinstance(stop_reason, str):
        return "stop_sequence", stop_reason  # vLLM names the stop string it matched
    return _STOP_REASONS.get(finish_reason or "stop", "end_turn"), None


def _usage(usage) -> dict:
    usage = usage if isinstance(usage, dict) else {}
    return {"input_tokens": int(usage.get("prompt_tokens") or 0),
            "output_tokens": int(usage.get("completion_tokens") or 0)}


def _tool_block(call: dict) -> dict:
    """A chat tool call as a tool_use block; arguments that are not a JSON object stay text (a broken call
    must not reach a client that will run it)."""
    function = call.get("function") or {}
    arguments = function.get("arguments") or "{}"
    try:
        parsed = orjson.loads(arguments)
    except orjson.JSONDecodeError:
        parsed = None
    if not isinstance(parsed, dict):
        return {"type": "text", "text": tool_calls.as_text(str(function.get("name") or ""), str(arguments))}
    return {"type": "tool_use", "id": call.get("id") or "", "name": function.get("name") or "",
            "input": parsed}


def to_message(data: dict, model: str) -> dict:
    """A chat completion reply (already given the client's model and id) as a Messages reply."""
    choices = data.get("choices") or [{}]
    choice = choices[0]
    message = choice.get("message") or {}
    content: list[dict] = []
    reasoning = message.get("reasoning") or message.get("reasoning_content")
    if reasoning:
        content.append({"type": "thinking", "thinking": reasoning, "signature": ""})
    if message.get("content"):
        content.append({"type": "text", "text": message["content"]})
    calls = [_tool_block(call) for call in message.get("tool_calls") or () if isinstance(call, dict)]
    content.extend(calls)
    stop_reason, stop_sequence = _stop_reason(choice.get("finish_reason"), choice.get("stop_reason"),
                                              any(block["type"] == "tool_use" for block in calls))
    return {"id": data.get("id") or "", "type": "message", "role": "assistant",
            "model": model, "content": content or [{"type": "text", "text": ""}],
            "stop_reason": stop_reason, "stop_sequence": stop_sequence, "usage": _usage(data.get("usage"))}


def _event(name: str, payload: dict) -> bytes:
    return b"event: " + name.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"


class MessageFrames:
    """A chat completions stream (the gateway's chunks, after its own rewriting) as Anthropic SSE events:
    message_start, then per block content_block_start / _delta / _stop, then message_delta (stop reason and
    usage) and message_stop. Only choice 0 is read: a Messages request has one reply."""

    def __init__(self, model: str):
        self.model = model
        self.started = False
        self.ended = False
        self.index = -1  # the open block's index
        self.block: str | None = None  # its type: "text" | "thinking" | "tool_use"
        self.tools: dict[int, int] = {}  # the chat call index -> its tool_use block index
        self.tool_used = False
        self.finish_reason: str | None = None
        self.stop_string: str | None = None

    def _start(self, chunk: dict, prompt_tokens: int) -> bytes:
        self.started = True
        return _event("message_start", {"type": "message_start", "message": {
            "id": chunk.get("id") or "", "type": "message", "role": "assistant",
            "model": self.model, "content": [], "stop_reason": None, "stop_sequence": None,
            "usage": {"input_tokens": prompt_tokens, "output_tokens": 0}}})

    def _close(self) -> bytes:
        if self.block is None:
            return b""
        self.block = None
        return _event("content_block_stop", {"type": "content_block_stop", "index": self.index})

    def _open(self, kind: str, block: dict) -> bytes:
        closed = self._close()
        self.index += 1
        self.block = kind
        return closed + _event("content_block_start", {"type": "content_block_start", "index": self.index,
                                                       "content_block": block})

    def _delta(self, delta: dict) -> bytes:
        return _event("content_block_delta", {"type": "content_block_delta", "index": self.index,
                                              "delta": delta})

    def chunk(self, chunk: dict, prompt_tokens: int = 0) -> bytes:
        """The events for one chat chunk (b"" for none). ``prompt_tokens``: the prompt's length if known."""
        out = [] if self.started else [self._start(chunk, prompt_tokens)]
        choices = chunk.get("choices") or ()
        choice = next((c for c in choices if isinstance(c, dict) and (c.get("index") or 0) == 0), None)
        if choice is not None:
            delta = choice.get("delta") or {}
            reasoning = delta.get("reasoning") or delta.get("reasoning_content")
            if reasoning:
                if self.block != "thinking":
                    out.append(self._open("thinking", {"type": "thinking", "thinking": "", "signature": ""}))
                out.append(self._delta({"type": "thinking_delta", "thinking": reasoning}))
            for call in delta.get("tool_calls") or ():
                out.append(self._tool_delta(call))
            if delta.get("content"):
                if self.block != "text":
                    out.append(self._open("text", {"type": "text", "text": ""}))
                out.append(self._delta({"type": "text_delta", "text": delta["content"]}))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
                stop = choice.get("stop_reason")
                self.stop_string = stop if isinstance(stop, str) else None
        if not choices and isinstance(chunk.get("usage"), dict):
            out.append(self._end(chunk["usage"]))
        return b"".join(out)

    def _tool_delta(self, call) -> bytes:
        if not isinstance(call, dict):
            return b""
        index = call.get("index") or 0
        function = call.get("function") or {}
        out = b""
        if index not in self.tools:
            self.tool_used = True
            out = self._open("tool_use", {"type": "tool_use", "id": call.get("id") or "",
                                          "name": function.get("name") or "", "input": {}})
            self.tools[index] = self.index
        arguments = function.get("arguments")
        if arguments and self.tools[index] == self.index and self.block == "tool_use":
            out += self._delta({"type": "input_json_delta", "partial_json": arguments})
        return out

    def _end(self, usage: dict | None) -> bytes:
        if self.ended:
            return b""
        self.ended = True
        stop_reason, stop_sequence = _stop_reason(self.finish_reason, self.stop_string, self.tool_used)
        return self._close() + _event("message_delta", {
            "type": "message_delta", "delta": {"stop_reason": stop_reason, "stop_sequence": stop_sequence},
            "usage": _usage(usage)})

    def done(self) -> bytes:
        start = b"" if self.started else self._start({}, 0)
        return start + self._end(None) + _event("message_stop", {"type": "message_stop"})

    def error(self, err: GatewayError) -> bytes:
        return _event("error", error_payload(err))
