"""Hostile /v1 input: identity parsing stays linear on any text and reads a bounded part of each message, a
4 MB body made to stall a backtracking regex answers at once while /healthz keeps answering, and every way a
request can end gives back what admission took (the key's, group's and adapter's leases)."""

import threading
import time

import httpx
import pytest
import redis
from django.conf import settings

from clawhub.gateway import forwarding as gateway_forwarding
from clawhub.gateway.identity import SCAN_CHARS, extract_identity
from clawhub.gateway.quotas import GroupLimits
from tests.factories import add_member, make_group, make_key, make_user
from tests.gateway.conftest import activate_adapter, wait_until

BIG = 4_000_000  # under the gateway's 4 MiB body bound, JSON included
META = "[RL-TRAINING-META] turn_type=main"
SESSION = "3f2b8c1e-5d6a-4e7f-9a0b-1c2d3e4f5a6b"


def hostile_messages() -> dict[str, list[dict]]:
    """Bodies that made a backtracking regex quadratic (or worse), and variants for each text reader."""
    spaces = " " * BIG
    return {
        "marker, spaces": [{"role": "system", "content": META + spaces + "x"},
                           {"role": "user", "content": "q"}],
        "marker, new line, spaces": [{"role": "system", "content": META + "\n" + spaces + "x"},
                                     {"role": "user", "content": "q"}],
        "many markers": [{"role": "system", "content": (META + " ") * (BIG // 40)},
                         {"role": "user", "content": "q"}],
        "runtime, spaces": [{"role": "user", "content": "Runtime:" + spaces + "x"}],
        "runtime lines": [{"role": "user", "content": ("\nRuntime: " + " " * 90) * (BIG // 100)}],
        "sessionId words": [{"role": "user", "content": "Runtime: " + "sessionId= " * (BIG // 11)}],
        "transcripts": [{"role": "user", "content": "<conversation>" * (BIG // 14)}],
        "heartbeat words": [{"role": "user", "content": "xHEARTBEAT.mdx" * (BIG // 14)}],
        "parts": [{"role": "user", "content": [{"type": "text", "text": "<conversation> " * 20}] * 10_000}],
    }


@pytest.mark.parametrize("name", list(hostile_messages()))
def test_identity_parsing_is_linear_on_hostile_text(name):
    body = {"model": "m", "messages": hostile_messages()[name]}
    started = time.perf_counter()
    extract_identity({}, body)
    # A backtracking regex took 2.4-9 s on 40 KB of this; hours on 4 MB.
    assert time.perf_counter() - started < 0.25


def test_identity_reads_both_ends_of_a_long_message_and_leaves_the_middle_alone():
    middle = "m" * (4 * SCAN_CHARS)
    system = {"role": "system",
              "content": f"You are helpful. {middle}\n[RL-TRAINING-META] session_id=s-1 turn_type=side"}
    user = {"role": "user",
            "content": f"[Tue 2026-12-01 08:27 UTC] {middle}\n\nRuntime: sessionId={SESSION} | x"}
    body = {"messages": [system, user]}
    identity = extract_identity({}, body)
    assert (identity.session_id, identity.turn_type) == ("s-1", "side")
    assert body["messages"][0]["content"] == f"You are helpful. {middle}"
    assert extract_identity({}, {"messages": [user]}).session_id == SESSION
    # A marker deep inside a message is neither read nor removed.
    buried = {"role": "system", "content": f"{middle}\n[RL-TRAINING-META] session_id=hidden\n{middle}"}
    body = {"messages": [buried]}
    assert extract_identity({}, body).session_id is None
    assert "session_id=hidden" in body["messages"][0]["content"]


def test_marker_lines_go_with_the_spaces_before_them_and_their_new_line():
    text = "A\n  [RL-TRAINING-META] session_id=a session_done=1\nB [RL-TRAINING-META] turn_type=side"
    body = {"messages": [{"role": "system", "content": text}]}
    identity = extract_identity({}, body)
    assert (identity.session_id, identity.turn_type, identity.session_done) == ("a", "side", True)
    assert body["messages"][0]["content"] == "A\nB"


def test_a_4mb_hostile_body_answers_within_a_second_and_healthz_keeps_answering(gateway_factory, fake,
                                                                                 secret):
    gateway = gateway_factory([fake.url], with_web=True)
    assert httpx.get(f"{gateway.url}/healthz", timeout=5).status_code == 200
    # The adapter's first load (the fake takes 0.2 s) is not what is measured.
    assert httpx.post(f"{gateway.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                      json={"model": "clawhub-personal", "messages": [{"role": "user", "content": "hi"}]},
                      timeout=30).status_code == 200
    bodies = [{"model": "clawhub-personal", "max_tokens": 4, "messages": hostile_messages()[name]}
              for name in ("marker, new line, spaces", "runtime, spaces", "transcripts")]
    health: list[float] = []
    took_all: list[float] = []
    done = threading.Event()

    def poll() -> None:
        while not done.is_set():
            started = time.perf_counter()
            assert httpx.get(f"{gateway.url}/healthz", timeout=10).status_code == 200
            health.append(time.perf_counter() - started)
            time.sleep(0.02)

    poller = threading.Thread(target=poll)
    poller.start()
    try:
        for body in bodies:
            started = time.perf_counter()
            response = httpx.post(f"{gateway.v1}/chat/completions", json=body, timeout=60,
                                  headers={"Authorization": f"Bearer {secret}"})
            took = time.perf_counter() - started
            assert response.status_code == 200, response.text
            took_all.append(took)
    finally:
        done.set()
        poller.join()
    assert max(took_all) < 1.0, f"hostile bodies took {took_all} s"
    assert health and max(health) < 0.5, f"/healthz took up to {max(health):.2f} s"


# --- every way a request ends frees what admission took -----------------------------------------------------


def nested(depth: int) -> object:
    """A JSON value ``depth`` levels deep (lists)."""
    value: object = 1
    for _ in range(depth - 1):
        value = [value]
    return value


def held(gateway, key_id: int, group_id: int, adapter: str) -> dict[str, int]:
    """What the gateway still holds: its own lease table, and the key's, group's and adapter's lease sets."""
    store = redis.Redis.from_url(settings.REDIS_URL)
    try:
        return {"table": len(gateway.app.limiter.leases),
                "key": store.zcard(f"gw:q:k{key_id}:conc"),
                "group": store.zcard(f"gw:q:g{group_id}:conc"),
                "adapter": store.zcard(f"gw:busy:{adapter}")}
    finally:
        store.close()


def _raise(*args, **kwargs):
    raise RuntimeError("broken on purpose")


ENDINGS = {
    # name: (extra body fields, stream, expected status or None for a client that leaves)
    "served": ({}, False, 200),
    "served, stream": ({}, True, 200),
    "nested 300 deep": ({"metadata": {"deep": nested(300)}}, False, 400),
    "nested 254 deep (forwarded, kept without its request)": ({"metadata": nested(254)}, False, 200),
    "upstream error": ({"fake_fault": "refuse"}, False, 502),
    "upstream dies mid-stream": ({"fake_fault": "die:3"}, True, 200),
    "upstream timeout": ({"fake_fault": "sleep", "fake_sleep": 3}, False, 504),
    "client disconnects": ({"fake_fault": "sleep", "fake_sleep": 3}, False, None),
    "client disconnects mid-stream": ({"fake_chunk_delay": 0.3, "max_tokens": 40}, True, None),
    "gateway bug (500)": ({}, False, 500),
    "hand-off fails": ({}, False, 200),
}


@pytest.mark.parametrize("ending", list(ENDINGS))
def test_every_ending_frees_the_key_group_and_adapter_leases(gateway_factory, fake, monkeypatch, ending):
    gateway = gateway_factory([fake.url], read_timeout=1.5, group_limits=GroupLimits(concurrency=1))
    group = make_group()
    member = add_member(group, make_user())
    key, secret = make_key(member, group=group, concurrency_limit=1)
    version = activate_adapter(group.tenant)
    adapter = f"t{group.tenant.pk}-v{version.version}"
    extra, stream, expected = ENDINGS[ending]
    if ending == "gateway bug (500)":
        monkeypatch.setattr(gateway_forwarding, "rewrite_response", _raise)
    if ending == "hand-off fails":
        monkeypatch.setattr(gateway.app.writer, "submit", _raise)
    body = {"model": f"clawhub-group-{group.slug}", "messages": [{"role": "user", "content": "hi"}],
            "stream": stream, **extra}
    headers = {"Authorization": f"Bearer {secret}"}
    url = f"{gateway.v1}/chat/completions"

    if expected is None and stream:
        with httpx.stream("POST", url, json=body, headers=headers, timeout=30) as response:
            next(response.iter_lines())
    elif expected is None:
        with pytest.raises(httpx.ReadTimeout):
            httpx.post(url, json=body, headers=headers, timeout=0.5)
    else:
        response = httpx.post(url, json=body, headers=headers, timeout=30)
        assert response.status_code == expected, response.text
        if expected != 200:
            assert set(response.json()["error"]) == {"message", "type", "param", "code"}
    wait_until(lambda: held(gateway, key.pk, group.pk, adapter) == {"table": 0, "key": 0, "group": 0,
                                                                     "adapter": 0}, timeout=5)
    monkeypatch.undo()
    # The key (concurrency 1) and the group (concurrency 1) serve again at once.
    body = {"model": f"clawhub-group-{group.slug}", "messages": [{"role": "user", "content": "again"}]}
    assert httpx.post(url, json=body, headers=headers, timeout=30).status_code == 200
    if ending != "hand-off fails":
        records = {r.request.get("messages", [{}])[0].get("content") if r.request.get("messages") else None: r
                   for r in gateway.spy.wait_for(2)}
        assert "again" in records and len(records) == 2  # the ending's turn was handed off, not lost
