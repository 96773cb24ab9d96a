"""The id a client sees for a completion the gateway served, and back: ``chatcmpl-<request id>`` (chat),
``cmpl-<request id>`` (completions), ``msg_<request id>`` (Anthropic's Messages API) or ``resp_<request id>``
(OpenAI's Responses API). The gateway writes it into every response; explicit feedback on /v1/feedback names
the turn by it. Plain functions, imported by both sides."""

_PREFIXES = {"chat": "chatcmpl-", "completions": "cmpl-", "messages": "msg_", "responses": "resp_"}


def completion_id_for(*, request_id: str, route: str) -> str:
    return _PREFIXES.get(route, "chatcmpl-") + request_id


def request_id_for(completion_id: str) -> str | None:
    for prefix in _PREFIXES.values():
        if completion_id.startswith(prefix) and len(completion_id) > len(prefix):
            return completion_id[len(prefix):]
    return None
