"""What the APIs served through the chat route (clawhub.gateway.messages, clawhub.gateway.responses) share
when they translate a request to chat: the refusal and the fields passed through as they are."""

from __future__ import annotations

from typing import Any

from clawhub.gateway.errors import GatewayError, bad_request

# ClawHub's own identity fields, read by the chat path's identity extraction wherever the client puts them.
IDENTITY_FIELDS = ("session_id", "turn_type", "session_done")


def refuse(message: str, param: str) -> GatewayError:
    return bad_request(message, param=param)


def pass_through(body: dict, chat: dict) -> dict:
    """``stream`` (checked) and ClawHub's identity fields from the client's body onto the chat request."""
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise refuse("'stream' must be a boolean.", "stream")
    if stream:
        chat["stream"] = True
    for name in IDENTITY_FIELDS:
        if name in body:
            chat[name] = body[name]
    return chat


def chat_function(tool: dict, parameters: Any, field: str) -> dict:
    """The chat API's function tool for a translated request's tool ``tool`` (its ``name`` checked already),
    whose parameter schema, read from its ``field``, is ``parameters``."""
    if not isinstance(parameters, dict):
        raise refuse(f"The '{field}' of tool {tool['name']!r} must be an object.", "tools")
    function = {"name": tool["name"], "parameters": parameters}
    if isinstance(tool.get("description"), str):
        function["description"] = tool["description"]
    return {"type": "function", "function": function}
