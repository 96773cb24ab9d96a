"""Forwarding to an upstream: one JSON round trip, or a real SSE stream relayed chunk by chunk.

Every chunk is parsed once, joined into the turn being recorded, given back the client-facing model id,
stripped of what the client did not ask for (token ids, logprobs, the usage-only chunk), and sent on at once.

What vLLM (0.32) returns with ``return_token_ids``: on a chat response, ``prompt_token_ids`` at the top level
(the chat template applied to messages, tools and ``chat_template_kwargs``) and ``token_ids`` in each choice
(every sampled token, reasoning and tool-call tokens included, the stop token too); streamed, the prompt's
ids come once, on the first chunk, and each chunk's choice carries the ids of its delta. The record keeps
both, so that training sees exactly the served sequence.
"""

import asyncio
import time
from dataclasses import dataclass, field
from typing import Any

import httpx
import orjson

from clawhub.conversations.capture.records import RawIds, TurnRecord
from clawhub.core.metrics import UPSTREAM_ERRORS
from clawhub.gateway import messages, responses, tool_calls
from clawhub.gateway.errors import GatewayError, normalise_upstream_error, upstream_refused, upstream_timeout
from clawhub.gateway.h1client import UpstreamResponse

SSE_HEADERS = [
    (b"content-type", b"text/event-stream; charset=utf-8"),
    (b"cache-control", b"no-cache"),
    (b"x-accel-buffering", b"no"),  # nginx and friends must not buffer the stream
]
DONE = b"data: [DONE]\n\n"
# The event streams of the APIs served through chat, by Wants.api: chat chunks in, that API's events out.
FRAMES = {"messages": messages.MessageFrames, "responses": responses.ResponseFrames}


@dataclass(slots=True)
class Wants:
    """What the client asked for, so whatever the gateway added for training can be taken out again."""

    model: str
    logprobs: bool
    token_ids: bool
    usage: bool  # stream_options.include_usage
    # The id the client sees for the completion (``gateway.feedback.completion_id_for``): explicit feedback on
    # /v1/feedback names the turn by it. vLLM's own id is per upstream process and recorded nowhere.
    completion_id: str = ""
    # The tools a chat request declared, the only ones a reply may call (tool_calls.py); None: not chat.
    declared_tools: frozenset[str] | None = None
    # The API the client speaks: "openai" (chat or completions, as the route says), "messages" (Anthropic's
    # Messages API) or "responses" (OpenAI's Responses API), the last two served through chat and given back
    # in their own shapes (clawhub.gateway.messages, clawhub.gateway.responses).
    api: str = "openai"


def estimate_prompt_tokens(request: dict) -> int:
    source = request.get("messages") if "messages" in request else request.get("prompt")
    return max(1, len(orjson.dumps(source)) // 4) if source else 0


def _strip_choice(choice: dict, wants: Wants) -> None:
    if not wants.token_ids:
        choice.pop("token_ids", None)
        choice.pop("prompt_token_ids", None)  # /v1/completions puts the prompt's ids in the choice
    if not wants.logprobs and choice.get("logprobs") is not None:
        choice["logprobs"] = None


def _choice0_logprobs(choice: dict) -> list[float] | None:
    lp = choice.get("logprobs")
    if not isinstance(lp, dict):
        return None
    if "content" in lp and isinstance(lp["content"], list):
        return [entry.get("logprob") for entry in lp["content"]]
    if isinstance(lp.get("token_logprobs"), list):  # /v1/completions shape
        return list(lp["token_logprobs"])
    return None


def _ids(value) -> list[int] | None:
    # A list of ints as vLLM sends it; only its ends are looked at: a whole pass over an agent's 15k prompt
    # ids cost more than the rest of the request.
    if type(value) is not list:
        return None
    return value if not value or (type(value[0]) is int and type(value[-1]) is int) else None


_PROMPT_IDS_KEY = b'"prompt_token_ids":'


def split_prompt_ids(raw: bytes) -> tuple[bytes, RawIds | None]:
    """A chat reply's body (or stream chunk) without its top-level ``prompt_token_ids``, and that list as the
    JSON text vLLM wrote (``RawIds``), or ``(raw, None)`` when it has none to cut.

    An agent's prompt is 15k ids and more: parsing them into ints for the record, which hands them on
    unchanged, cost more than the rest of the request. The list is cut out as bytes instead (found by its key
    and the first ``]`` after it) and not looked into: capture parses it once when it stores the turn and
    drops text that is not a list of ids. In a chat reply the key appears once, at the top level: inside a
    string its quotes would be escaped. A cut that leaves the rest unparseable (a list holding a string with a
    ``]``: never vLLM's) is undone by ``parse_reply``."""
    start = raw.find(_PROMPT_IDS_KEY)
    if start < 0 or raw.find(_PROMPT_IDS_KEY, start + 1) >= 0:
        return raw, None
    value = start + len(_PROMPT_IDS_KEY)
    end = raw.find(b"]", value)
    if raw[value:value + 1] != b"[" or end < 0:
        return raw, None
    ids = RawIds(raw[value:end + 1])
    if raw[start - 1:start] == b",":
        start -= 1  # the comma before it goes with it
    elif raw[end + 1:end + 2] == b",":
        end += 1  # the first key: the comma after it
    return raw[:start] + raw[end + 1:], ids


def parse_reply(raw: bytes, chat: bool) -> tuple[Any, RawIds | None]:
    """The reply (or chunk) parsed, less its prompt ids when they could be cut out unparsed
    (split_prompt_ids). Raises orjson.JSONDecodeError when the body is not JSON."""
    rest, ids = split_prompt_ids(raw) if chat else (raw, None)
    try:
        return orjson.loads(rest), ids
    except orjson.JSONDecodeError:
        if ids is None:
            raise
    return orjson.loads(raw), None


def rewrite_response(data: dict, wants: Wants, record: TurnRecord, prompt_ids: RawIds | None = None) -> None:
    """Non-streaming: records choice 0's sampled tokens, then makes the body what the client expects.
    ``prompt_ids``: the prompt's ids as split_prompt_ids cut them out of the body (then not in ``data``)."""
    data["model"] = wants.model
    if wants.completion_id:
        data["id"] = wants.completion_id
    choices = data.get("choices") or []
    if wants.declared_tools is not None:
        for choice in choices:
            if isinstance(choice.get("message"), dict):
                tool_calls.filter_message(choice["message"], choice, wants.declared_tools)
    if choices:
        first = choices[0]
        record.token_ids = first.get("token_ids")
        record.logprobs = _choice0_logprobs(first)
    if prompt_ids is not None:
        record.prompt_token_ids = prompt_ids  # handed to capture as it came
        if wants.token_ids:
            data["prompt_token_ids"] = orjson.Fragment(prompt_ids.raw)
    else:
        record.prompt_token_ids = _ids(data.get("prompt_token_ids"))
        if not wants.token_ids:
            data.pop("prompt_token_ids", None)
    for choice in choices:
        _strip_choice(choice, wants)
    record.choices = choices
    usage = data.get("usage")
    if isinstance(usage, dict):
        record.prompt_tokens = int(usage.get("prompt_tokens") or 0)
        record.completion_tokens = int(usage.get("completion_tokens") or 0)
    else:
        record.prompt_tokens = estimate_prompt_tokens(record.request)
        record.completion_tokens = len(record.token_ids or ())
        record.usage_estimated = True


@dataclass(slots=True)
class _Choice:
    index: int
    content: list[str] = field(default_factory=list)
    reasoning: list[str] = field(default_factory=list)
    tool_calls: dict[int, dict] = field(default_factory=dict)
    finish_reason: str | None = None


class StreamJoiner:
    """Joins SSE chunks into the choices, token ids and logprobs of the turn."""

    def __init__(self, chat: bool):
        self.chat = chat
        self.choices: dict[int, _Choice] = {}
        self.token_ids: list[int] = []
        self.logprobs: list[float] = []
        self.prompt_token_ids: list[int] | RawIds | None = None
        self.usage: dict | None = None
        self.content_chunks = 0

    def add(self, choice: dict) -> None:
        index = choice.get("index") or 0
        state = self.choices.get(index)
        if state is None:
            state = self.choices[index] = _Choice(index)
        if self.chat:
            delta = choice.get("delta") or {}
            text = delta.get("content")
            reasoning = delta.get("reasoning_content") or delta.get("reasoning")
            if reasoning:
                state.reasoning.append(reasoning)
            for call in delta.get("tool_calls") or ():
                self._add_tool_call(state, call)
                self.content_chunks += 1
        else:
            text = choice.get("text")
        if text:
            state.content.append(text)
            self.content_chunks += 1
        if choice.get("finish_reason"):
            state.finish_reason = choice["finish_reason"]
        if index == 0:
            ids = choice.get("token_ids")
            if ids:
                self.token_ids.extend(ids)
            lps = _choice0_logprobs(choice)
            if lps:
                self.logprobs.extend(lps)

    @staticmethod
    def _add_tool_call(state: _Choice, call: dict) -> None:
        slot = state.tool_calls.get(call.get("index", 0))
        function = call.get("function") or {}
        if slot is None:
            slot = state.tool_calls[call.get("index", 0)] = {
                "id": call.get("id"), "type": call.get("type") or "function",
                "function": {"name": function.get("name"), "arguments": ""}}
        else:
            slot["id"] = slot["id"] or call.get("id")
            if function.get("name") and not slot["function"]["name"]:
                slot["function"]["name"] = function["name"]
        slot["function"]["arguments"] += function.get("arguments") or ""

    def result(self) -> list[dict]:
        out = []
        for index in sorted(self.choices):
            state = self.choices[index]
            text = "".join(state.content) if state.content else None
            if not self.chat:
                out.append({"index": index, "text": text or "", "finish_reason": state.finish_reason})
                continue
            message: dict = {"role": "assistant", "content": text}
            if state.tool_calls:
                message["tool_calls"] = [state.tool_calls[i] for i in sorted(state.tool_calls)]
            if state.reasoning:
                message["reasoning_content"] = "".join(state.reasoning)
            out.append({"index": index, "message": message, "finish_reason": state.finish_reason})
        return out


async def relay_stream(response: UpstreamResponse, send, wants: Wants, record: TurnRecord,
                       chat: bool) -> None:
    """Relays an upstream SSE stream that already answered 200. Fills ``record``; never raises for upstream
    failures (the client gets an error chunk and the record says "cut")."""
    joiner = StreamJoiner(chat)
    tools = tool_calls.ToolCallStream(wants.declared_tools) if wants.declared_tools is not None else None
    frames = FRAMES[wants.api](wants.model) if wants.api in FRAMES else None
    await send({"type": "http.response.start", "status": 200, "headers": SSE_HEADERS})
    buffer = b""
    saw_done = False
    upstream_error: GatewayError | None = None
    try:
        async for raw in response.aiter_raw():
            buffer += raw
            out: list[bytes] = []
            while True:
                end = buffer.find(b"\n\n")
                if end < 0:
                    break
                event, buffer = buffer[:end], buffer[end + 2:]
                for line in event.split(b"\n"):
                    if not line.startswith(b"data:"):
                        continue  # comments and other fields carry nothing a client needs
                    data = line[5:].strip()
                    if data == b"[DONE]":
                        saw_done = True
                        continue
                    chunk = _rewrite_chunk(data, joiner, wants, tools)
                    if isinstance(chunk, GatewayError):
                        upstream_error = chunk
                        break
                    if chunk is None:
                        continue
                    if frames is None:
                        out.append(b"data: " + orjson.dumps(chunk) + b"\n\n")
                    else:
                        out.append(frames.chunk(chunk, len(joiner.prompt_token_ids or ())))
                if upstream_error is not None:
                    break
            if out:
                if record.ttft_ms is None:
                    record.ttft_ms = (time.time() - record.started_at) * 1000
                await send({"type": "http.response.body", "body": b"".join(out), "more_body": True})
            if upstream_error is not None or saw_done:
                break
    except asyncio.CancelledError:
        # The client went away (see watch_disconnect): the caller closes the upstream stream.
        record.status, record.error = "cut", "client disconnected"
        _estimate_if_missing(record, joiner)
        raise
    except httpx.TimeoutException:
        upstream_error = upstream_timeout()
        upstream_error.upstream_kind = "timeout"
    except httpx.HTTPError:
        upstream_error = upstream_refused("The model server stopped in the middle of the response.")
    finally:
        _finish(record, joiner)
    if upstream_error is not None or not saw_done:
        error = upstream_error or upstream_refused("The model server ended the response early.")
        UPSTREAM_ERRORS.labels(kind=error.upstream_kind).inc()
        record.status, record.error = "cut", error.message
        _estimate_if_missing(record, joiner)
        body = frames.error(error) if frames is not None else b"data: " + error.body() + b"\n\n"
        await send({"type": "http.response.body", "body": body})
        return
    record.status = "complete"
    await send({"type": "http.response.body", "body": frames.done() if frames is not None else DONE})


def _rewrite_chunk(data: bytes, joiner: StreamJoiner, wants: Wants,
                   tools: tool_calls.ToolCallStream | None = None) -> dict | GatewayError | None:
    try:
        # The first chunk carries the prompt's ids.
        chunk, prompt_ids = parse_reply(data, joiner.chat and joiner.prompt_token_ids is None)
    except orjson.JSONDecodeError:
        error = upstream_refused("The model server sent a malformed stream chunk.")
        error.upstream_kind = "protocol"
        return error
    if not isinstance(chunk, dict):
        return None
    if "error" in chunk and "choices" not in chunk:
        status = 500 if not isinstance(chunk["error"], dict) else _status_of(chunk["error"])
        error = normalise_upstream_error(status, data, client_model=wants.model)
        error.upstream_kind = "http_5xx" if status >= 500 else "http_4xx"
        return error
    chunk["model"] = wants.model
    if wants.completion_id:
        chunk["id"] = wants.completion_id
    choices = chunk.get("choices")
    usage = chunk.get("usage")
    if usage:
        joiner.usage = usage
    if prompt_ids is not None:
        joiner.prompt_token_ids = prompt_ids  # handed to capture as it came
        if wants.token_ids:
            chunk["prompt_token_ids"] = orjson.Fragment(prompt_ids.raw)
    elif joiner.prompt_token_ids is None and chunk.get("prompt_token_ids") is not None:
        joiner.prompt_token_ids = _ids(chunk["prompt_token_ids"])  # the first chunk only
    if not wants.token_ids:
        chunk.pop("prompt_token_ids", None)
    if not choices:
        if usage and not wants.usage:
            return None  # the usage-only chunk the gateway asked for on its own behalf
    else:
        for choice in choices:
            if tools is not None:
                tools.filter(choice)
            joiner.add(choice)
            _strip_choice(choice, wants)
    if not wants.usage:
        chunk.pop("usage", None)
    return chunk


def _status_of(error: dict) -> int:
    code = error.get("code")
    return code if isinstance(code, int) and 400 <= code < 600 else 500


def _finish(record: TurnRecord, joiner: StreamJoiner) -> None:
    record.choices = joiner.result()
    record.token_ids = joiner.token_ids or None
    record.logprobs = joiner.logprobs or None
    record.prompt_token_ids = joiner.prompt_token_ids
    if joiner.usage:
        record.prompt_tokens = int(joiner.usage.get("prompt_tokens") or 0)
        record.completion_tokens = int(joiner.usage.get("completion_tokens") or 0)


def _estimate_if_missing(record: TurnRecord, joiner: StreamJoiner) -> None:
    if joiner.usage:
        return
    record.prompt_tokens = estimate_prompt_tokens(record.request)
    record.completion_tokens = len(joiner.token_ids) or joiner.content_chunks
    record.usage_estimated = True


async def watch_disconnect(receive, task: asyncio.Task, state: dict) -> None:
    """Cancels the streaming task when the client goes away, so the upstream stream is closed at once."""
    while True:
        message = await receive()
        if message["type"] == "http.disconnect":
            if not state["done"]:  # a stream that already ended must not be cancelled after the fact
                state["gone"] = True
                task.cancel()
            return
