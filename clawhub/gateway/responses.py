"""OpenAI's Responses API (``POST /v1/responses``, what Codex CLI speaks) on top of the chat route.

As for Anthropic's Messages API (clawhub.gateway.messages), a Responses request is translated into a chat
completions request and served by the chat path, so the turn is captured with the served token ids and
log-probs (vLLM's own /v1/responses cannot return them) and links to the turn it continues: the client resends
the conversation as input items, which translate to the chat messages that extend the earlier turn's.

Stateless: nothing is kept for ``previous_response_id`` (refused: send the whole conversation as ``input``, as
Codex CLI does with ``store: false``); ``store: true`` is refused for the same reason, and every response says
``"store": false``. Only function tools are offered to the model: the hosted ones (web search, file search,
code interpreter, computer use, MCP) and free-form custom tools have nothing here to run them. Errors keep the
OpenAI shape of the rest of /v1.

    chat_body = to_chat(body)             # the request, refused (400) where it cannot be served
    response = to_response(chat_reply)    # a whole reply
    frames = ResponseFrames(...)          # a stream: chat chunks in, Responses SSE events out
"""

from __future__ import annotations

import time

import orjson

from clawhub.gateway.errors import GatewayError, bad_request
from clawhub.gateway.translated import chat_function, pass_through
from clawhub.gateway.translated import refuse as _refuse

PATH = "/v1/responses"
_ROLES = {"user": "user", "assistant": "assistant", "system": "system", "developer": "system"}
_TEXT_PARTS = ("input_text", "output_text", "text")
# Items a client may send back that carry nothing the model reads (reasoning we never produce).
_SKIPPED_ITEMS = ("reasoning",)
# Codex CLI's conversation id, in the headers it has sent it under.
_SESSION_HEADERS = (b"session_id", b"session-id", b"conversation_id", b"conversation-id")


# --- request ------------------------------------------------------------------------------------------------
def _content(content, role: str) -> str | list[dict]:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise _refuse("A message's 'content' must be a string or a list of content parts.", "input")
    parts: list[dict] = []
    for part in content:
        kind = part.get("type") if isinstance(part, dict) else None
        if kind in _TEXT_PARTS or kind == "refusal":
            text = part.get("text") if kind != "refusal" else part.get("refusal")
            if not isinstance(text, str):
                raise _refuse(f"A '{kind}' part needs text (a string).", "input")
            parts.append({"type": "text", "text": text})
        elif kind == "input_image" and role == "user":
            url = part.get("image_url")
            if not isinstance(url, str) or not url:
                raise _refuse("An 'input_image' part needs 'image_url' (a URL or data: URL); file ids "
                              "are not supported.", "input")
            parts.append({"type": "image_url", "image_url": {"url": url}})
        else:
            raise _refuse(f"Content parts of type {kind!r} are not supported in a {role} message.", "input")
    if all(p["type"] == "text" for p in parts):
        return "".join(p["text"] for p in parts)
    return parts


def _assistant_with_calls(out: list[dict]) -> dict:
    """The assistant message a function_call item belongs to: the one just before it, or a new one. A reply
    with text and calls comes back as several items; the chat turn it was is one message."""
    if out and out[-1]["role"] == "assistant":
        return out[-1]
    message: dict = {"role": "assistant", "content": None}
    out.append(message)
    return message


def _item(item, out: list[dict]) -> None:
    if not isinstance(item, dict):
        raise _refuse("Every input item must be an object.", "input")
    kind = item.get("type", "message" if "role" in item else None)
    if kind == "message":
        role = _ROLES.get(item.get("role"))  # type: ignore[arg-type]
        if role is None:
            raise _refuse("A message's 'role' must be user, assistant, system or developer.", "input")
        out.append({"role": role, "content": _content(item.get("content"), role)})
    elif kind == "function_call":
        name, call_id, arguments = item.get("name"), item.get("call_id"), item.get("arguments", "")
        if not (isinstance(name, str) and name and isinstance(call_id, str) and call_id
                and isinstance(arguments, str)):
            raise _refuse("A function_call item needs 'call_id', 'name' and 'arguments' (strings).", "input")
        message = _assistant_with_calls(out)
        message.setdefault("tool_calls", []).append(
            {"id": call_id, "type": "function", "function": {"name": name, "arguments": arguments}})
    elif kind == "function_call_output":
        call_id, output = item.get("call_id"), item.get("output")
        if not isinstance(call_id, str) or not call_id:
            raise _refuse("A function_call_output item needs 'call_id' (a string).", "input")
        if isinstance(output, list):
            output = _content(output, "tool")
        if not isinstance(output, str):
            raise _refuse("A function_call_output's 'output' must be a string or a list of text parts.",
                          "input")
        out.append({"role": "tool", "tool_call_id": call_id, "content": output})
    elif kind in _SKIPPED_ITEMS:
        return
    else:
        raise _refuse(f"Input items of type {kind!r} are not supported.", "input")


def _tools(tools) -> list[dict]:
    if not isinstance(tools, list):
        raise _refuse("'tools' must be a list.", "tools")
    out = []
    for tool in tools:
        if not isinstance(tool, dict) or not isinstance(tool.get("type"), str):
            raise _refuse("Every tool must be an object with a 'type'.", "tools")
        if tool["type"] != "function":
            continue  # hosted and custom tools: nothing here can run them, so the model is not offered them
        if not isinstance(tool.get("name"), str) or not tool["name"]:
            raise _refuse("A function tool needs 'name' (a string).", "tools")
        out.append(chat_function(tool, tool.get("parameters") or {"type": "object", "properties": {}},
                                 "parameters"))
    return out


def _tool_choice(choice):
    if choice in ("auto", "none", "required"):
        return choice
    if isinstance(choice, dict) and choice.get("type") == "function" and isinstance(choice.get("name"), str):
        return {"type": "function", "function": {"name": choice["name"]}}
    raise _refuse("'tool_choice' must be 'auto', 'none', 'required' or {type: function, name}.",
                  "tool_choice")


def _number(body: dict, name: str, chat: dict, target: str | None = None, *, integer: bool = False) -> None:
    value = body.get(name)
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int if integer else int | float):
        raise _refuse(f"'{name}' must be {'an integer' if integer else 'a number'}.", name)
    chat[target or name] = value


def to_chat(body) -> dict:
    """The chat completions request that serves Responses request ``body``; 400 where it cannot be served."""
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise _refuse("You must provide a model parameter (a string).", "model")
    if body.get("previous_response_id") is not None:
        raise _refuse("'previous_response_id' is not supported: responses are not stored here. Send the "
                      "whole conversation as 'input' (with store: false), as Codex CLI does.",
                      "previous_response_id")
    if body.get("store") is True:
        raise _refuse("'store': true is not supported: responses are not stored for retrieval here (the "
                      "turn is still captured for training). Send store: false.", "store")
    if body.get("background") is True:
        raise _refuse("'background' responses are not supported.", "background")
    instructions, given = body.get("instructions"), body.get("input")
    chat_messages: list[dict] = []
    if instructions is not None:
        if not isinstance(instructions, str):
            raise _refuse("'instructions' must be a string.", "instructions")
        if instructions:
            chat_messages.append({"role": "system", "content": instructions})
    if isinstance(given, str):
        chat_messages.append({"role": "user", "content": given})
    elif isinstance(given, list):
        for item in given:
            _item(item, chat_messages)
    else:
        raise _refuse("'input' must be a string or a list of input items.", "input")
    if not any(m["role"] != "system" for m in chat_messages):
        raise _refuse("'input' holds nothing to answer.", "input")
    chat: dict = {"model": model, "messages": chat_messages}
    if body.get("tools") is not None:
        tools = _tools(body["tools"])
        if tools:
            chat["tools"] = tools
    if body.get("tool_choice") is not None:
        chat["tool_choice"] = _tool_choice(body["tool_choice"])
    if body.get("parallel_tool_calls") is not None:
        if not isinstance(body["parallel_tool_calls"], bool):
            raise _refuse("'parallel_tool_calls' must be a boolean.", "parallel_tool_calls")
        chat["parallel_tool_calls"] = body["parallel_tool_calls"]
    _number(body, "max_output_tokens", chat, "max_tokens", integer=True)
    if chat.get("max_tokens") is not None and chat["max_tokens"] < 1:
        raise _refuse("'max_output_tokens' must be positive.", "max_output_tokens")
    _number(body, "temperature", chat)
    _number(body, "top_p", chat)
    return pass_through(body, chat)


def client_session_id(headers: dict[bytes, bytes], body: dict) -> str | None:
    """Codex CLI's conversation id: a ``session_id`` / ``conversation_id`` header, else ``prompt_cache_key``
    (Codex sets it to the conversation id)."""
    for name in _SESSION_HEADERS:
        value = headers.get(name)
        if value and value.strip():
            return value.strip().decode("latin-1")
    key = body.get("prompt_cache_key") if isinstance(body, dict) else None
    return key if isinstance(key, str) and key else None


def side_kind(body: dict) -> str | None:
    """Codex CLI's side requests by shape: none known. In ``codex exec`` runs (0.171.0) every request was a
    turn of the conversation (``request_kind: "turn"`` in its x-codex-turn-metadata header)."""
    return None


# --- response -----------------------------------------------------------------------------------------------
def _usage(usage) -> dict:
    usage = usage if isinstance(usage, dict) else {}
    prompt, completion = int(usage.get("prompt_tokens") or 0), int(usage.get("completion_tokens") or 0)
    return {"input_tokens": prompt, "input_tokens_details": {"cached_tokens": 0}, "output_tokens": completion,
            "output_tokens_details": {"reasoning_tokens": 0}, "total_tokens": prompt + completion}


def _item_id(response_id: str, kind: str, n: int) -> str:
    return f"{kind}_{response_id.removeprefix('resp_')}_{n}"


def _message_item(response_id: str, n: int, text: str, status: str = "completed") -> dict:
    return {"type": "message", "id": _item_id(response_id, "msg", n), "status": status, "role": "assistant",
            "content": [{"type": "output_text", "text": text, "annotations": []}]}


def _call_item(response_id: str, n: int, call: dict, status: str = "completed") -> dict:
    function = call.get("function") or {}
    return {"type": "function_call", "id": _item_id(response_id, "fc", n), "call_id": call.get("id") or "",
            "name": function.get("name") or "", "arguments": function.get("arguments") or "",
            "status": status}


def _envelope(response_id: str, model: str, created: int, output: list[dict], finish_reason: str | None,
              usage, *, status: str | None = None) -> dict:
    cut = finish_reason == "length"
    return {"id": response_id, "object": "response", "created_at": created,
            "status": status or ("incomplete" if cut else "completed"), "model": model, "output": output,
            "error": None, "incomplete_details": {"reason": "max_output_tokens"} if cut else None,
            "store": False, "usage": _usage(usage) if usage is not None else None}


def to_response(data: dict, model: str) -> dict:
    """A chat completion reply (already given the client's model and id) as a Responses reply."""
    choice = (data.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    response_id = str(data.get("id") or "")
    output: list[dict] = []
    if message.get("content"):
        output.append(_message_item(response_id, 0, message["content"]))
    for call in message.get("tool_calls") or ():
        if isinstance(call, dict):
            output.append(_call_item(response_id, len(output), call))
    return _envelope(response_id, model, int(data.get("created") or time.time()), output,
                     choice.get("finish_reason"), data.get("usage"))


class ResponseFrames:
    """A chat completions stream (the gateway's chunks, after its own rewriting) as Responses SSE events:
    response.created and .in_progress; per output item output_item.added, its content_part.added /
    output_text.delta / .done or function_call_arguments.delta / .done, output_item.done; then
    response.completed (or .incomplete) with the whole response and its usage. Only choice 0 is read."""

    def __init__(self, model: str):
        self.model = model
        self.response_id = ""
        self.created = int(time.time())
        self.sequence = 0
        self.started = False
        self.output: list[dict] = []
        self.open: dict | None = None  # the output item being streamed
        self.calls: dict[int, dict] = {}  # the chat call index -> its function_call item
        self.finish_reason: str | None = None
        self.usage: dict | None = None

    def _event(self, kind: str, payload: dict) -> bytes:
        payload = {"type": kind, "sequence_number": self.sequence, **payload}
        self.sequence += 1
        return b"event: " + kind.encode() + b"\ndata: " + orjson.dumps(payload) + b"\n\n"

    def _start(self, chunk: dict) -> bytes:
        self.started = True
        self.response_id = str(chunk.get("id") or "")
        envelope = _envelope(self.response_id, self.model, self.created, [], None, None, status="in_progress")
        return (self._event("response.created", {"response": envelope})
                + self._event("response.in_progress", {"response": envelope}))

    def _close(self) -> bytes:
        item = self.open
        if item is None:
            return b""
        self.open = None
        index = self.output.index(item)
        item["status"] = "completed"
        out = b""
        if item["type"] == "message":
            part = item["content"][0]
            common = {"item_id": item["id"], "output_index": index, "content_index": 0}
            out += self._event("response.output_text.done", {**common, "text": part["text"]})
            out += self._event("response.content_part.done", {**common, "part": part})
        else:
            out += self._event("response.function_call_arguments.done", {
                "item_id": item["id"], "output_index": index, "arguments": item["arguments"]})
        return out + self._event("response.output_item.done", {"output_index": index, "item": item})

    def _open(self, item: dict) -> bytes:
        out = self._close()
        self.output.append(item)
        self.open = item
        index = len(self.output) - 1
        added = {**item, "content": []} if item["type"] == "message" else item
        out += self._event("response.output_item.added", {"output_index": index, "item": added})
        if item["type"] == "message":
            out += self._event("response.content_part.added", {
                "item_id": item["id"], "output_index": index, "content_index": 0,
                "part": {"type": "output_text", "text": "", "annotations": []}})
        return out

    def chunk(self, chunk: dict, prompt_tokens: int = 0) -> bytes:
        """The events for one chat chunk (b"" for none)."""
        out = [] if self.started else [self._start(chunk)]
        choices = chunk.get("choices") or ()
        choice = next((c for c in choices if isinstance(c, dict) and (c.get("index") or 0) == 0), None)
        if choice is not None:
            delta = choice.get("delta") or {}
            for call in delta.get("tool_calls") or ():
                out.append(self._call_delta(call))
            text = delta.get("content")
            if text:
                if self.open is None or self.open["type"] != "message":
                    out.append(self._open(_message_item(self.response_id, len(self.output), "",
                                                        status="in_progress")))
                item = self.open
                item["content"][0]["text"] += text
                out.append(self._event("response.output_text.delta", {
                    "item_id": item["id"], "output_index": len(self.output) - 1, "content_index": 0,
                    "delta": text}))
            if choice.get("finish_reason"):
                self.finish_reason = choice["finish_reason"]
        if not choices and isinstance(chunk.get("usage"), dict):
            self.usage = chunk["usage"]
        return b"".join(out)

    def _call_delta(self, call) -> bytes:
        if not isinstance(call, dict):
            return b""
        index = call.get("index") or 0
        out = b""
        item = self.calls.get(index)
        if item is None:
            item = self.calls[index] = _call_item(self.response_id, len(self.output),
                                                   {**call, "function": {**(call.get("function") or {}),
                                                                         "arguments": ""}},
                                                   status="in_progress")
            out = self._open(item)
        arguments = (call.get("function") or {}).get("arguments")
        if arguments and item is self.open:
            item["arguments"] += arguments
            out += self._event("response.function_call_arguments.delta", {
                "item_id": item["id"], "output_index": len(self.output) - 1, "delta": arguments})
        return out

    def done(self) -> bytes:
        start = b"" if self.started else self._start({})
        envelope = _envelope(self.response_id, self.model, self.created, self.output, self.finish_reason,
                             self.usage)
        kind = "response.incomplete" if envelope["status"] == "incomplete" else "response.completed"
        return start + self._close() + self._event(kind, {"response": envelope})

    def error(self, err: GatewayError) -> bytes:
        return self._event("error", {"code": err.code, "message": err.message, "param": err.param})

