"""POST /v1/feedback: explicit feedback on a completion, with the API key that asked for it.

An agent or client rates what it was served by the completion's ``id`` (the gateway answers every completion
with ``chatcmpl-<request id>`` or ``cmpl-<request id>``), within the key's ``inference`` scope: a key rates
the turns it served, nothing else (a rotated-out secret too: it is the same key). The body:

    {"completion_id": "chatcmpl-…", "thumb": "up" | "down", "score": 1-5, "comment": "…",
     "demonstration": "the reply I wanted"}

Any of the last four, at least one; sending it again for the same completion updates it. The answer is the
feedback as the REST API shows it (``/api/turns/<id>/feedback/``), errors are OpenAI-shaped.
"""

from collections.abc import Awaitable, Callable
from typing import Any

import orjson

from clawhub.feedback.completion_ids import completion_id_for, request_id_for
from clawhub.gateway.errors import GatewayError, bad_request

__all__ = ["MAX_BODY", "PATH", "answer", "completion_id_for"]

PATH = "/v1/feedback"
MAX_BODY = 64 * 1024
_FIELDS = ("thumb", "score", "comment", "demonstration")


def _error(exc) -> GatewayError:
    # ClawHub's own errors as the gateway renders every error (OpenAI-shaped).
    kind = "invalid_request_error" if exc.status < 500 else "api_error"
    fields = exc.data.get("fields")
    param = next(iter(fields), None) if isinstance(fields, dict) else exc.data.get("field")
    return GatewayError(exc.status, exc.message, type=kind, code=exc.code, param=param)


def _submit(key_id: int, user_id: int, body: dict[str, Any]) -> dict[str, Any]:
    from clawhub.accounts.models import User
    from clawhub.core.exceptions import ClawHubError, NotFound
    from clawhub.feedback.models import ExplicitFeedback
    from clawhub.feedback.selectors import turn_for_rating
    from clawhub.review.api import ExplicitFeedbackOutputSerializer
    from clawhub.review.services import feedback_submit

    try:
        request_id = request_id_for(body["completion_id"])
        actor = User.objects.filter(pk=user_id, is_active=True).first()
        if request_id is None or actor is None:
            raise NotFound("No such completion.")
        turn = turn_for_rating(actor=actor, request_id=request_id, key_id=key_id)
        feedback, _ = feedback_submit(actor=actor, turn=turn, source=ExplicitFeedback.Source.GATEWAY,
                                      key_id=key_id, **{f: body[f] for f in _FIELDS if f in body})
    except ClawHubError as exc:
        if exc.code == "not_found":
            exc.message = "No such completion (a key rates the completions it was served)."
        raise _error(exc) from None
    return ExplicitFeedbackOutputSerializer(feedback).data


async def answer(gateway, headers: dict[bytes, bytes], method: str,
                 read_body: Callable[[int], Awaitable[bytes]]) -> bytes:
    """The JSON body of a 200 answer (errors raise GatewayError, which the gateway renders)."""
    if method != "POST":
        raise GatewayError(405, f"Use POST for {PATH}.", code="method_not_allowed")
    _, _, entry = await gateway._authenticate(headers)
    raw = await read_body(MAX_BODY)
    try:
        body = orjson.loads(raw)
    except orjson.JSONDecodeError:
        raise bad_request("The request body is not valid JSON.", code="invalid_json") from None
    if not isinstance(body, dict) or not isinstance(body.get("completion_id"), str):
        raise bad_request("Send a JSON object with the completion's id as 'completion_id'.",
                          param="completion_id")
    unknown = sorted(set(body) - {"completion_id", *_FIELDS})
    if unknown:
        raise bad_request(f"Unknown field(s): {', '.join(unknown)}.", param=unknown[0])
    data = await gateway.db.run(_submit, entry.info.key_id, entry.info.user_id, body)
    return orjson.dumps(data)
