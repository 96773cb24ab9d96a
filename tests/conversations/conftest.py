"""Builders for TurnRecords as the gateway hands them to capture, and for the messages inside them."""

import itertools
import time

import pytest

from clawhub.conversations.capture.records import TurnRecord
from clawhub.keys.models import ApiKey
from tests.factories import make_key

_seq = itertools.count(1)
# Records of one test start a second apart, in the order they are built, so sessions and turns order plainly.
_T0 = time.time() - 3600


def system(text: str = "You are a helpful agent.") -> dict:
    return {"role": "system", "content": text}


def user(text: str) -> dict:
    return {"role": "user", "content": text}


def assistant(text: str | None = None, tool_calls: list[dict] | None = None) -> dict:
    message: dict = {"role": "assistant", "content": text}
    if tool_calls:
        message["tool_calls"] = tool_calls
    return message


def tool_call(name: str, arguments: str = "{}", call_id: str | None = None) -> dict:
    return {
        "id": call_id or f"call_{next(_seq)}",
        "type": "function",
        "function": {"name": name, "arguments": arguments},
    }


def tool(text: str, call_id: str = "call_x") -> dict:
    return {"role": "tool", "tool_call_id": call_id, "content": text}



def topic_session(name: str) -> tuple[list[dict], list[dict], list[dict]]:
    """The three requests of an agent's session on topic ``name``: "topic <name>", then each request the one
    before with its reply ("about <name>", "more about <name>") and the user's next message ("more <name>",
    "done with <name>")."""
    first = [user(f"topic {name}")]
    second = [*first, assistant(f"about {name}"), user(f"more {name}")]
    return first, second, [*second, assistant(f"more about {name}"), user(f"done with {name}")]

def approved_sample(turn):
    """A judged (+1) and approved sample of ``turn``, as review would leave it."""
    from clawhub.feedback.models import Judgment
    from clawhub.review.models import Sample

    judgment = Judgment.objects.create(
        turn=turn,
        tenant=turn.tenant,
        reward=1,
        votes=[1, 1, 1],
        hints=[],
        judge="rule",
        prompt_version="t",
        raw_outputs={},
        status="ok",
    )
    return Sample.objects.create(
        turn=turn,
        judgment=judgment,
        tenant=turn.tenant,
        user=turn.user,
        key=turn.key,
        reward=1,
        state=Sample.State.APPROVED,
    )


def make_record(
    key: ApiKey,
    messages: list[dict] | None = None,
    *,
    reply: str | None = "Sure.",
    tool_calls: list[dict] | None = None,
    **fields,
) -> TurnRecord:
    """A served chat request by ``key`` with ``messages``, answered by ``reply`` (and ``tool_calls``)."""
    n = next(_seq)
    tenant = key.group.tenant if key.group_id else key.owner.tenant
    status = fields.pop("status", "complete")
    choices = (
        []
        if status == "failed"
        else [
            {
                "index": 0,
                "finish_reason": "tool_calls" if tool_calls else "stop",
                "message": {
                    "role": "assistant",
                    "content": reply,
                    **({"tool_calls": tool_calls} if tool_calls else {}),
                },
            }
        ]
    )
    values = dict(
        request_id=f"req-{n}",
        route="chat",
        key_id=key.pk,
        user_id=key.owner_id,
        tenant_id=tenant.pk,
        group_id=key.group_id,
        model=tenant.model_id,
        upstream_model="base-model",
        adapter_version_id=None,
        upstream="http://127.0.0.1:8100",
        status=status,
        http_status=502 if status == "failed" else 200,
        started_at=_T0 + n,
        latency_ms=120.0,
        request={"messages": messages if messages is not None else [user(f"hello {n}")], "temperature": 0.6},
        choices=choices,
        prompt_tokens=10 + n % 7,
        completion_tokens=3 + n % 5,
    )
    values.update(fields)
    return TurnRecord(**values)


@pytest.fixture
def key(db) -> ApiKey:
    return make_key()[0]
