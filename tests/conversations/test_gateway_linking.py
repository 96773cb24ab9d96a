"""Linking through the real gateway: two gateway processes (two Gateway apps, each with its own writer) serve
one conversation in turns, and the second one's writer commits first. The fake upstream answers like vLLM,
prompt token ids included."""

import httpx

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session, Turn
from tests.factories import make_key, make_user
from tests.gateway.conftest import fake, fake_upstream, gateway_factory  # noqa: F401

RUNTIME = (
    "Runtime: agent=main | session=agent:main:main | sessionId=7d3e0c52-1111-4000-8000-00000000abcd | host=h"
)


def test_out_of_order_commits_from_two_gateway_processes(gateway_factory, fake):  # noqa: F811
    one, two = gateway_factory([fake.url]), gateway_factory([fake.url])
    owner = make_user()
    _, secret = make_key(owner)
    headers = {"Authorization": f"Bearer {secret}"}
    history = [
        {"role": "system", "content": "You are OpenClaw."},
        {"role": "user", "content": f"[Tue 2026-12-01 08:27 UTC] hello\n\n{RUNTIME}"},
    ]
    sent = []
    for i, gw in enumerate([one, two, one, two]):
        body = {
            "model": "clawhub-personal",
            "messages": history,
            "stream": True,
            "stream_options": {"include_usage": True},
        }
        response = httpx.post(f"{gw.v1}/chat/completions", json=body, headers=headers, timeout=30)
        assert response.status_code == 200
        text = "".join(
            httpx.Response(200, content=line[6:]).json()["choices"][0]["delta"].get("content") or ""
            for line in response.text.splitlines()
            if line.startswith("data: {") and '"delta"' in line
        )
        sent.append(history)
        history = [
            *history,
            {"role": "assistant", "content": text},
            {"role": "user", "content": f"[Tue 2026-12-01 08:{28 + i} UTC] next {i}"},
        ]
    # Gateway two's writer (turns 2 and 4) commits before gateway one's (turns 1 and 3).
    capture_store(two.spy.wait_for(2))
    capture_store(one.spy.wait_for(2))

    turns = list(Turn.objects.filter(user=owner).order_by("created_at"))
    assert len(turns) == 4 and len({t.session_id for t in turns}) == 1
    assert Session.objects.filter(user=owner).count() == 1
    assert [t.next_state for t in turns] == [
        [{"role": "user", "content": f"[Tue 2026-12-01 08:{28 + i} UTC] next {i}"}] for i in range(3)
    ] + [None]
    assert [t.parent_id for t in turns] == [None, turns[0].pk, turns[1].pk, turns[2].pk]
    assert [t.link for t in turns] == ["", "next", "next", "next"]
    assert all(t.prompt_token_count and t.ended == "stop" for t in turns)
