"""A /v1 request body: parsed and checked (``parse_json``, ``parse_request``), written again for the upstream
(``encode_body``), and its model checked against the key (``check_model``)."""

import orjson

from clawhub.gateway.auth import KeyInfo
from clawhub.gateway.errors import bad_request, model_not_allowed, model_not_found
from clawhub.gateway.fields import check_fields
from clawhub.tenants import naming


def parse_json(raw: bytes) -> dict:
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict):
        raise bad_request("The request body must be a JSON object.")
    return body


def parse_request(raw: bytes, chat: bool) -> dict:
    body = parse_json(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise bad_request("You must provide a model parameter (a string).", param="model")
    if chat:
        messages = body.get("messages")
        if not isinstance(messages, list) or not messages:
            raise bad_request("'messages' must be a non-empty list.", param="messages")
        if not all(isinstance(m, dict) for m in messages):
            raise bad_request("Every message must be an object.", param="messages")
        if body.get("logprobs") is not None and not isinstance(body["logprobs"], bool):
            raise bad_request("'logprobs' must be a boolean.", param="logprobs")
    else:
        prompt = body.get("prompt")
        if not isinstance(prompt, str | list):
            raise bad_request("'prompt' must be a string or a list.", param="prompt")
    for name, kind, label in (("stream", bool, "a boolean"), ("stream_options", dict, "an object"),
                              ("n", int, "an integer"), ("return_token_ids", bool, "a boolean"),
                              ("max_tokens", int, "an integer"),
                              ("max_completion_tokens", int, "an integer")):
        value = body.get(name)
        if value is not None and (not isinstance(value, kind) or (kind is int and isinstance(value, bool))):
            raise bad_request(f"'{name}' must be {label}.", param=name)
    check_fields(body)
    return body


def encode_body(body: dict) -> bytes:
    try:
        return orjson.dumps(body)
    except orjson.JSONEncodeError:
        # orjson reads 1,024 levels of nesting but writes only 254: a body between the two parses and cannot
        # be forwarded. Found here, where the body is written anyway, rather than by a walk of every body.
        raise bad_request("The request body is nested too deeply (over 254 levels).",
                          code="invalid_json") from None


def check_model(info: KeyInfo, model: str) -> None:
    access = naming.model_access(model=model, tenant_model_id=info.model_id,
                                 allowed_models=info.allowed_models, versions=info.playground)
    if access == "not_allowed":
        raise model_not_allowed(model)
    if access == "not_found":
        raise model_not_found(model)
