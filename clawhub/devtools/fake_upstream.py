"""A small, fast, vLLM-shaped upstream for tests and benchmarks (no Django; serve it with uvicorn).

It answers like vLLM 0.32's OpenAI server, including its odd error shapes, and names the model it was asked
for in every reply so tests can tell adapters apart. Faults are chosen by the requested model name
(``fault-refuse``, ``fault-sleep``, ``fault-die-<k>``), the ``x-fake-fault`` header or a ``fake_fault`` body
field (which a gateway passes through like any unknown field): ``refuse``, ``sleep`` (``fake_sleep`` seconds),
``die:<k>``, ``detail``, ``unauthorized``; ``fake_chunk_delay`` slows a stream down. ``GET /_fake/stats`` and
``POST /_fake/reset`` let tests count
adapter loads and see the last request body exactly as it arrived. ``POST /tokenize`` counts a chat prompt's
words as its tokens.

Environment: FAKE_BASE_MODEL (default "tiny"), FAKE_API_KEY (require it, like ``vllm serve --api-key``),
FAKE_LOAD_DELAY (seconds a load takes), FAKE_SLEEP (seconds the sleep fault waits), FAKE_CHUNK_DELAY.
"""

import asyncio
import os
import time

import orjson

BASE_MODEL = os.environ.get("FAKE_BASE_MODEL", "tiny")
API_KEY = os.environ.get("FAKE_API_KEY", "")
LOAD_DELAY = float(os.environ.get("FAKE_LOAD_DELAY", "0.05"))
SLEEP = float(os.environ.get("FAKE_SLEEP", "30"))
CHUNK_DELAY = float(os.environ.get("FAKE_CHUNK_DELAY", "0"))
DEFAULT_TOKENS = 8


class State:
    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        self.adapters: dict[str, str] = {}
        self.load_calls: dict[str, int] = {}
        self.unload_calls: dict[str, int] = {}
        self.requests: dict[str, int] = {}
        self.last_request: dict | None = None
        self.last_headers: dict | None = None
        self.aborted = 0  # requests whose client disconnected while they slept


state = State()


class Abort(Exception):
    """Raised after a partial response so uvicorn drops the connection (an upstream dying mid-stream)."""


def _is_int(value) -> bool:
    """What vLLM's (pydantic, lax) request models take for an integer field: an integer, a float without a
    fraction, or a string of one."""
    if isinstance(value, float):
        return value.is_integer()
    if isinstance(value, str):
        try:
            int(value)
        except ValueError:
            return False
        return True
    return isinstance(value, int)


def _error(status: int, message: str, type_: str, code=None, param=None) -> tuple[int, dict]:
    # vLLM's shape: OpenAI-like, but type is a class name and code an int.
    return status, {"error": {"message": message, "type": type_, "param": param, "code": code or status}}


async def _send_json(send, status: int, payload, headers: list | None = None) -> None:
    body = orjson.dumps(payload)
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())] + (headers or [])})
    await send({"type": "http.response.body", "body": body})


async def _read_body(receive) -> bytes:
    chunks = []
    while True:
        message = await receive()
        chunks.append(message.get("body", b""))
        if not message.get("more_body"):
            return b"".join(chunks)


def _tokens(model: str, max_tokens: int, index: int) -> list[str]:
    words = [model, "says", "hello"] + [f"w{index}-{i}" for i in range(max(0, max_tokens - 3))]
    return words[:max_tokens]


def _token_id(word: str, position: int) -> int:
    return 1000 + (sum(word.encode()) * 7 + position) % 30000


def _logprob_entry(word: str, position: int, top: int) -> dict:
    lp = -round(0.05 * (position + 1), 4)
    entry = {"token": word, "logprob": lp, "bytes": list(word.encode()), "top_logprobs": []}
    for k in range(top):
        entry["top_logprobs"].append({"token": f"{word}~{k}" if k else word, "logprob": lp - k,
                                      "bytes": list(word.encode())})
    return entry


def _tool_for(body: dict) -> str | None:
    tools, choice = body.get("tools") or [], body.get("tool_choice")
    if not tools or choice in (None, "none", "auto"):
        return None
    if isinstance(choice, dict):
        return choice.get("function", {}).get("name")
    return tools[0].get("function", {}).get("name")  # "required"


def _tool_finish(body: dict) -> str:
    return "stop" if isinstance(body.get("tool_choice"), dict) else "tool_calls"


def _offsets(words: list[str]) -> list[int]:
    offsets, at = [], 0
    for word in words:
        offsets.append(at)
        at += len(word) + 1
    return offsets


def _prompt_words(body: dict) -> list[str]:
    if "messages" in body:
        text = " ".join(m.get("content") or "" if isinstance(m.get("content"), str | None) else "x"
                        for m in body["messages"])
    else:
        prompt = body.get("prompt")
        text = prompt if isinstance(prompt, str) else " ".join(map(str, prompt or []))
    return text.split() or [""]


def _prompt_tokens(body: dict) -> int:
    return len(_prompt_words(body))


def _prompt_ids(body: dict) -> list[int]:
    # One id per word of the messages, by word and position like vLLM's would be by token: a request that
    # resends a conversation starts with the ids of the earlier request's prompt.
    return [_token_id(w, p) for p, w in enumerate(_prompt_words(body))]


def _fault(model: str, headers: dict, body: dict) -> str:
    fault = headers.get("x-fake-fault", "") or str(body.get("fake_fault") or "")
    if not fault and model.startswith("fault-"):
        fault = model[6:].replace("die-", "die:")
    return fault


async def _completion(scope, receive, send, chat: bool) -> None:
    raw = await _read_body(receive)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        # vLLM 0.32 answers a malformed body with its pydantic validation message in the usual error shape.
        await _send_json(send, *_error(
            400, "1 validation error:\n  {'type': 'json_invalid', 'loc': 'body.1', "
            "'msg': 'JSON decode error'}",
            "Bad Request", param="body.1"))
        return
    headers = {k.decode().lower(): v.decode() for k, v in scope["headers"]}
    state.last_request, state.last_headers = body, headers
    model = body.get("model") or BASE_MODEL
    state.requests[model] = state.requests.get(model, 0) + 1
    fault = _fault(model, headers, body)
    refusal = _fault_reply(fault, body)
    if refusal is not None:
        await _send_json(send, *refusal)
        return
    if fault == "sleep" and not await _sleep_unless_aborted(receive, body, headers):
        return
    invalid = _invalid(body, model, chat)
    if invalid is not None:
        await _send_json(send, *invalid)
        return
    stream = body.get("stream", False)
    n = int(body.get("n") or 1)
    max_tokens = int(body.get("max_completion_tokens") or body.get("max_tokens") or DEFAULT_TOKENS)
    want_lp = bool(body.get("logprobs")) if chat else body.get("logprobs") is not None
    top = int(body.get("top_logprobs") or 0) if chat else int(body.get("logprobs") or 0)
    want_ids = bool(body.get("return_token_ids"))
    tool = _tool_for(body) if chat else None
    prompt_tokens = _prompt_tokens(body)
    created = int(time.time())
    rid = f"{'chatcmpl' if chat else 'cmpl'}-{os.urandom(8).hex()}"
    obj = "chat.completion" if chat else "text_completion"
    if stream:
        await _stream(send, body, chat, rid, created, model, n, max_tokens, want_lp, top, want_ids, tool,
                      prompt_tokens, fault)
        return
    choices, completion_tokens = [], 0
    for i in range(n):
        words = _tokens(model, max_tokens, i)
        completion_tokens += len(words)
        choices.append(_choice(body, chat, i, words, model, max_tokens, want_lp, top, want_ids, tool))
    payload = {"id": rid, "object": obj, "created": created, "model": model, "choices": choices,
               "usage": {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                         "total_tokens": prompt_tokens + completion_tokens}}
    if chat:
        payload["prompt_token_ids"] = _prompt_ids(body) if want_ids else None
    await _send_json(send, 200, payload)


def _fault_reply(fault: str, body: dict) -> tuple[int, dict] | None:
    """The answer of a fault that refuses the request outright (status, payload), or None."""
    if fault == "refuse":
        return 500, {"object": "error", "message": "EngineCore died at /opt/vllm/engine.py",
                     "type": "InternalServerError", "param": None, "code": 500}
    if fault == "detail":
        return 400, {"detail": "There was an error parsing the body"}
    if fault == "unauthorized":
        return 401, {"error": "Unauthorized"}
    if fault == "echo":  # like vLLM's messages that quote the request (a user's conversation)
        said = str((body.get("messages") or [{}])[-1].get("content"))
        return 400, {"error": {"message": f"This prompt is not valid: {said!r}",
                               "type": "BadRequestError", "param": None, "code": 400}}
    return None


async def _sleep_unless_aborted(receive, body: dict, headers: dict) -> bool:
    """The sleep fault: False when the client went away first. Like vLLM, a request whose client goes away
    while it is being generated is aborted (and counted)."""
    seconds = float(body.get("fake_sleep") or headers.get("x-fake-sleep", SLEEP))
    sleeper = asyncio.ensure_future(asyncio.sleep(seconds))
    listener = asyncio.ensure_future(receive())
    await asyncio.wait({sleeper, listener}, return_when=asyncio.FIRST_COMPLETED)
    if not sleeper.done():
        sleeper.cancel()
        state.aborted += 1
        return False
    listener.cancel()
    return True


def _invalid(body: dict, model: str, chat: bool) -> tuple[int, dict] | None:
    """vLLM's answer to a request it refuses before anything runs (status, payload), or None."""
    if model != BASE_MODEL and model not in state.adapters and not model.startswith("fault-"):
        # Like vLLM, the message lists every name it serves: other tenants' adapters included.
        names = ", ".join([BASE_MODEL, *state.adapters])
        return _error(404, f"The model `{model}` does not exist. Valid aliases: {names}.", "NotFoundError",
                      param="model")
    if body.get("stream_options") is not None and not body.get("stream", False):
        return _error(400, "Stream options can only be defined when `stream=True`. "
                      "(parameter=stream_options)", "BadRequestError", param="stream_options")
    if chat and not isinstance(body.get("messages"), list):
        return _error(400, "1 validation error:\n  {'type': 'missing', 'loc': 'body.messages', "
                      "'msg': 'Field required'}", "Bad Request", param="body.messages")
    counts = ("n", "max_completion_tokens", "max_tokens", "top_logprobs", *(() if chat else ("logprobs",)))
    wrong = next((f for f in counts if body.get(f) is not None and not _is_int(body[f])), None)
    if wrong is not None:  # vLLM's request models refuse it before anything runs
        return _error(400, f"1 validation error:\n  {{'type': 'int_type', 'loc': 'body.{wrong}', "
                      "'msg': 'Input should be a valid integer'}", "Bad Request", param=f"body.{wrong}")
    return None


def _choice(body: dict, chat: bool, i: int, words: list[str], model: str, max_tokens: int, want_lp: bool,
            top: int, want_ids: bool, tool: str | None) -> dict:
    """Choice ``i`` of a reply that is not streamed."""
    text = " ".join(words)
    choice: dict = {"index": i, "logprobs": None, "finish_reason": "length" if max_tokens <= len(words)
                    and max_tokens != DEFAULT_TOKENS else "stop", "stop_reason": None}
    if chat:
        message: dict = {"role": "assistant", "content": text, "refusal": None, "reasoning": None}
        if tool:
            # vLLM: content "" beside the calls; finish_reason "tool_calls" for "required", but "stop"
            # for a named function (guided decoding ends normally).
            message["content"] = ""
            arguments = '{"query": "' + model + '"}'
            message["tool_calls"] = [{"id": f"chatcmpl-tool-{i}", "type": "function",
                                      "function": {"name": tool, "arguments": arguments}}]
            choice["finish_reason"] = _tool_finish(body)
        choice["message"] = message
        if want_lp:
            choice["logprobs"] = {"content": [_logprob_entry(w, p, top) for p, w in enumerate(words)]}
    else:
        choice["text"] = text
        if want_lp:
            lps = [-0.05 * (p + 1) for p in range(len(words))]
            choice["logprobs"] = {"text_offset": _offsets(words), "token_logprobs": lps, "tokens": words,
                                  "top_logprobs": [{w: lp} for w, lp in zip(words, lps, strict=True)]}
        if want_ids:
            # /v1/completions keeps the prompt's ids in the choice, not at the top level.
            choice["prompt_token_ids"] = _prompt_ids(body)
    # vLLM always has the field; null unless return_token_ids was asked.
    choice["token_ids"] = [_token_id(w, p) for p, w in enumerate(words)] if want_ids else None
    return choice


async def _stream(send, body, chat, rid, created, model, n, max_tokens, want_lp, top, want_ids, tool,
                  prompt_tokens, fault) -> None:
    die_after = int(fault.split(":")[1]) if fault.startswith("die:") else None
    delay = float(body.get("fake_chunk_delay") or CHUNK_DELAY)
    await send({"type": "http.response.start", "status": 200,
                "headers": [(b"content-type", b"text/event-stream; charset=utf-8")]})
    obj = "chat.completion.chunk" if chat else "text_completion"
    sent = 0

    async def emit(payload) -> None:
        nonlocal sent
        if die_after is not None and sent >= die_after:
            raise Abort("simulated upstream death")
        data = payload if isinstance(payload, bytes) else orjson.dumps(payload)
        await send({"type": "http.response.body", "body": b"data: " + data + b"\n\n", "more_body": True})
        sent += 1
        if delay:
            await asyncio.sleep(delay)

    def chunk(choices, **extra) -> dict:
        return {"id": rid, "object": obj, "created": created, "model": model, "choices": choices, **extra}

    completion_tokens = 0
    for i in range(n):
        words = _tokens(model, max_tokens, i)
        completion_tokens += len(words)
        if chat:
            # vLLM: a role chunk first; with return_token_ids it carries the prompt's ids at the top level.
            first = chunk([{"index": i, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                            "finish_reason": None}])
            first["prompt_token_ids"] = _prompt_ids(body) if want_ids and i == 0 else None
            await emit(first)
        if tool:
            # The first tool delta names the function and has no "arguments" key; the rest carry arguments.
            await emit(chunk([{"index": i, "delta": {"content": None, "tool_calls": [{
                "id": f"chatcmpl-tool-{i}", "type": "function", "index": 0, "function": {"name": tool}}]},
                "logprobs": None, "finish_reason": None, "token_ids": None}]))
            for piece in ('{"query": ', '"' + model + '"}'):
                await emit(chunk([{"index": i, "delta": {"content": None, "tool_calls": [
                    {"index": 0, "function": {"arguments": piece}}]}, "logprobs": None, "finish_reason": None,
                    "token_ids": None}]))
        else:
            for p, w in enumerate(words):
                text = w if p == 0 else " " + w
                c: dict = {"index": i, "logprobs": None, "finish_reason": None}
                if chat:
                    c["delta"] = {"content": text}
                    if want_lp:
                        c["logprobs"] = {"content": [_logprob_entry(text, p, top)]}
                else:
                    c["text"] = text
                    c["stop_reason"] = None
                    # /v1/completions: the prompt's ids ride in the first chunk's choice.
                    c["prompt_token_ids"] = _prompt_ids(body) if want_ids and p == 0 else None
                c["token_ids"] = [_token_id(w, p)] if want_ids else None
                await emit(chunk([c]))
        last: dict = {"index": i, "logprobs": None, "finish_reason": _tool_finish(body) if tool else "stop",
                      "stop_reason": None, "token_ids": None}
        if chat:
            last["delta"] = {}
        else:
            last["text"] = ""
        await emit(chunk([last]))
    if (body.get("stream_options") or {}).get("include_usage"):
        await emit(chunk([], usage={"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                                    "total_tokens": prompt_tokens + completion_tokens}))
    await emit(b"[DONE]")
    await send({"type": "http.response.body", "body": b""})


async def _load(receive, send) -> None:
    body = orjson.loads(await _read_body(receive) or b"{}")
    name, path = body.get("lora_name"), body.get("lora_path")
    state.load_calls[name] = state.load_calls.get(name, 0) + 1
    if LOAD_DELAY:
        await asyncio.sleep(LOAD_DELAY)
    if name in state.adapters:
        await _send_json(send, *_error(
            400, f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in "
            "place, set 'load_inplace' to True.", "InvalidUserInput"))
        return
    if not path or "missing" in path:
        await _send_json(send, *_error(404, f"Loading lora {name} failed: No adapter found for {path}",
                                       "NotFoundError"))
        return
    state.adapters[name] = path
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    message = f"Success: LoRA adapter '{name}' added successfully."
    await send({"type": "http.response.body", "body": message.encode()})


async def _unload(receive, send) -> None:
    body = orjson.loads(await _read_body(receive) or b"{}")
    name = body.get("lora_name")
    state.unload_calls[name] = state.unload_calls.get(name, 0) + 1
    if state.adapters.pop(name, None) is None:
        await _send_json(send, *_error(404, f"The lora adapter '{name}' cannot be found.", "NotFoundError"))
        return
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-type", b"text/plain")]})
    message = f"Success: LoRA adapter '{name}' removed successfully."
    await send({"type": "http.response.body", "body": message.encode()})


def _models() -> dict:
    data = [{"id": BASE_MODEL, "object": "model", "created": 0, "owned_by": "vllm", "root": BASE_MODEL,
             "parent": None, "max_model_len": 2048}]
    data += [{"id": name, "object": "model", "created": 0, "owned_by": "vllm", "root": path,
              "parent": BASE_MODEL, "max_model_len": 2048} for name, path in state.adapters.items()]
    return {"object": "list", "data": data}


async def app(scope, receive, send) -> None:
    if scope["type"] == "lifespan":
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await send({"type": "lifespan.shutdown.complete"})
                return
    path, method = scope["path"], scope["method"]
    if path == "/health":
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b""})
        return
    if path == "/_fake/stats":
        await _send_json(send, 200, {"adapters": state.adapters, "load_calls": state.load_calls,
                                     "unload_calls": state.unload_calls, "requests": state.requests,
                                     "aborted": state.aborted,
                                     "last_request": state.last_request, "last_headers": state.last_headers})
        return
    if path == "/_fake/reset":
        state.reset()
        await _send_json(send, 200, {"ok": True})
        return
    if API_KEY:
        auth = dict(scope["headers"]).get(b"authorization", b"").decode()
        if auth != f"Bearer {API_KEY}":
            await _send_json(send, 401, {"error": "Unauthorized"})
            return
    if path == "/v1/models" and method == "GET":
        await _send_json(send, 200, _models())
    elif path == "/v1/chat/completions" and method == "POST":
        await _completion(scope, receive, send, chat=True)
    elif path == "/v1/completions" and method == "POST":
        await _completion(scope, receive, send, chat=False)
    elif path == "/tokenize" and method == "POST":
        body = orjson.loads(await _read_body(receive))
        state.last_request = body
        ids = _prompt_ids(body)
        await _send_json(send, 200, {"count": len(ids), "max_model_len": 2048, "tokens": ids})
    elif path == "/v1/load_lora_adapter" and method == "POST":
        await _load(receive, send)
    elif path == "/v1/unload_lora_adapter" and method == "POST":
        await _unload(receive, send)
    else:
        await _send_json(send, 404, {"detail": "Not Found"})
