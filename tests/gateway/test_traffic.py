"""The gateway under agent traffic, against the fake upstream: stale pooled connections, exact token limits
under a burst, concurrency leases (renewed while a request runs, freed after a crash), a non-streamed client
that goes away, and OpenClaw's requests as they really arrive (no session headers)."""

import asyncio
import threading
import time

import httpx
import orjson
import pytest

from clawhub.conversations.models import Session, Turn
from tests.factories import make_key, make_user
from tests.gateway.conftest import inside_one_minute, wait_until
from tests.gateway.processes import start_gateway_process

MSGS = [{"role": "user", "content": "hi"}]


def post(url: str, secret: str, body: dict, timeout: float = 30) -> httpx.Response:
    return httpx.post(f"{url}/chat/completions", json=body, timeout=timeout,
                      headers={"Authorization": f"Bearer {secret}"})


def chat(**extra) -> dict:
    return {"model": "clawhub-personal", "messages": MSGS, **extra}


# --- stale pooled connections ---------------------------------------------------------------------------


class ClosingUpstream:
    """A vLLM-shaped upstream that, like a server whose keep-alive ran out as the request went out, closes a
    connection without answering when a second completion arrives on it."""

    def __init__(self):
        self.completions = 0
        self.closed_unanswered = 0
        self.loop = asyncio.new_event_loop()
        self.ready = threading.Event()
        self.thread = threading.Thread(target=self._run, daemon=True)
        self.thread.start()
        self.ready.wait(10)

    def _run(self) -> None:
        asyncio.set_event_loop(self.loop)
        self.server = self.loop.run_until_complete(asyncio.start_server(self._serve, "127.0.0.1", 0))
        self.url = f"http://127.0.0.1:{self.server.sockets[0].getsockname()[1]}"
        self.ready.set()
        self.loop.run_forever()

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        served_completion = False
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                lines = head.decode().split("\r\n")
                method, path, _ = lines[0].split(" ")
                length = next((int(v) for k, v in (ln.split(":", 1) for ln in lines[1:] if ":" in ln)
                               if k.lower() == "content-length"), 0)
                if length:
                    await reader.readexactly(length)
                if path == "/v1/chat/completions":
                    if served_completion:
                        self.closed_unanswered += 1
                        writer.close()
                        return
                    served_completion = True
                    self.completions += 1
                    body = orjson.dumps({"id": "c", "object": "chat.completion", "created": 0,
                                         "model": "tiny",
                                         "choices": [{"index": 0, "finish_reason": "stop", "message": {
                                             "role": "assistant", "content": "ok"}}],
                                         "usage": {"prompt_tokens": 1, "completion_tokens": 1,
                                                   "total_tokens": 2}})
                elif path == "/v1/models":
                    body = orjson.dumps({"object": "list", "data": [{"id": "tiny", "parent": None,
                                                                     "max_model_len": 2048}]})
                else:
                    body = b"{}"
                writer.write(b"HTTP/1.1 200 OK\r\ncontent-type: application/json\r\ncontent-length: "
                             + str(len(body)).encode() + b"\r\n\r\n" + body)
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            writer.close()

    def stop(self) -> None:
        self.loop.call_soon_threadsafe(self.server.close)
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(5)


def test_a_stale_pooled_connection_is_retried_once_and_the_upstream_stays_healthy(gateway_factory):
    upstream = ClosingUpstream()
    try:
        # Connections kept long: every completion after the first reuses a connection the upstream then closes
        # unanswered.
        gateway = gateway_factory([upstream.url], upstream_keepalive=60, health_interval=60)
        _, secret = make_key(make_user())
        for _ in range(4):
            response = post(gateway.v1, secret, {"model": "base", "messages": MSGS})
            assert response.status_code == 200, response.text
        assert upstream.closed_unanswered >= 1
        assert upstream.completions == 4
        assert all(up.healthy for up in gateway.app.pool.upstreams)
    finally:
        upstream.stop()


def test_a_switched_adapter_is_served_from_the_next_request_though_its_cache_lives_minutes(gateway, fake):
    """The tenant's active adapter is cached for minutes (GATEWAY_ADAPTER_CACHE_SECONDS) and checked in each
    request's admission against the tenant's adapter generation, which a switch bumps."""
    from tests.gateway.conftest import activate_adapter

    assert gateway.app.config.adapter_cache_seconds >= 60
    user = make_user()
    _, secret = make_key(user)
    activate_adapter(user.tenant, 1)
    served = []
    for version, tell in ((2, False), (3, True)):
        assert post(gateway.v1, secret, chat()).status_code == 200
        served.append(fake.stats()["last_request"]["model"])
        activate_adapter(user.tenant, version, tell_gateways=tell)
    assert post(gateway.v1, secret, chat()).status_code == 200
    served.append(fake.stats()["last_request"]["model"])
    t = user.tenant.pk
    # v2 without a bump stays unseen (the cache is long); the bump for v3 is seen at once.
    assert served == [f"t{t}-v1", f"t{t}-v1", f"t{t}-v3"]


def test_the_upstream_keep_alive_defaults_below_vllms_five_seconds(settings):
    assert settings.GATEWAY_UPSTREAM_KEEPALIVE_SECONDS < 5


# --- exact token limits ------------------------------------------------------------------------------------


def test_a_burst_of_concurrent_requests_cannot_take_a_key_past_its_tpm(gateway):
    from clawhub.gateway.quotas import RedisLimiter

    assert isinstance(gateway.app.limiter, RedisLimiter)  # shared by every worker, as in production
    tpm = 1000
    _, secret = make_key(make_user(), tpm_limit=tpm)

    async def burst():
        async with httpx.AsyncClient(timeout=30) as client:
            return await asyncio.gather(*(
                client.post(f"{gateway.v1}/chat/completions", headers={"Authorization": f"Bearer {secret}"},
                            json=chat(max_tokens=100, fake_fault="sleep", fake_sleep=0.5))
                for _ in range(30)))

    inside_one_minute(5)  # the bound is per fixed minute: keep the burst inside one
    responses = asyncio.run(burst())
    ok = [r for r in responses if r.status_code == 200]
    refused = [r for r in responses if r.status_code == 429]
    assert len(ok) + len(refused) == 30 and ok and refused
    used = sum(r.json()["usage"]["total_tokens"] for r in ok)
    # Every admitted request used 101 tokens (one prompt word, 100 written); all of them ran at once, so a
    # check of "used so far" alone would have admitted every one of the 30 (3030 tokens).
    assert used <= tpm
    assert len(ok) >= 5  # the reservations (about 133 tokens each) were settled as requests ended


# --- concurrency leases ------------------------------------------------------------------------------------


def test_a_running_request_keeps_its_lease_past_the_lease_period(gateway_factory, fake):
    gateway = gateway_factory([fake.url], lease_seconds=1.0)
    _, secret = make_key(make_user(), concurrency_limit=1)
    slow = threading.Thread(target=post, args=(gateway.v1, secret, chat(fake_fault="sleep", fake_sleep=3.5)))
    slow.start()
    time.sleep(0.3)
    statuses = []
    for _ in range(3):  # at 0.3, 1.3 and 2.3 s: past two lease periods, the lease was renewed
        statuses.append(post(gateway.v1, secret, chat()).status_code)
        time.sleep(1.0)
    slow.join()
    assert statuses == [429, 429, 429]
    assert post(gateway.v1, secret, chat()).status_code == 200


def test_a_crashed_workers_lease_frees_within_its_lease_period(gateway_factory, fake, tmp_path):
    lease = 2.0
    worker = start_gateway_process([{"url": fake.url, "base_model": "tiny"}], tmp_path / "worker.log",
                                   GATEWAY_LEASE_SECONDS=str(lease))
    survivor = gateway_factory([fake.url])
    _, secret = make_key(make_user(), concurrency_limit=1)
    try:
        stuck = threading.Thread(target=lambda: pytest.raises(httpx.HTTPError, post, worker.v1, secret,
                                                              chat(fake_fault="sleep", fake_sleep=60)))
        sent = sum(fake.stats()["requests"].values())
        stuck.start()
        # The stuck request holds the key's one slot once it reached the upstream; asking before that could
        # take the slot from it (and it would get the 429).
        wait_until(lambda: sum(fake.stats()["requests"].values()) > sent, timeout=20, interval=0.05)
        assert post(survivor.v1, secret, chat()).status_code == 429
        worker.kill()
        killed = time.monotonic()
        wait_until(lambda: post(survivor.v1, secret, chat()).status_code == 200, timeout=lease + 5,
                   interval=0.1)
        freed_after = time.monotonic() - killed
        stuck.join(10)
    finally:
        worker.stop()
    assert freed_after <= lease + 1.0, freed_after


def test_a_worker_started_during_a_database_outage_serves_the_keys_other_workers_know(gateway_factory, fake,
                                                                                         tmp_path):
    """A new worker (or pod) has no lookups of its own: it serves the keys and tenant adapters another
    process looked up, from the shared cache, unless the key changed since; a key nobody looked up is 503."""
    from clawhub.keys.services import key_revoke
    from tests.gateway.conftest import activate_adapter

    known = gateway_factory([fake.url])  # a worker that ran before the outage
    user = make_user()
    _, secret = make_key(user)
    revoked, revoked_secret = make_key(user)
    _, unseen_secret = make_key(make_user())
    activate_adapter(user.tenant)
    for key_secret in (secret, revoked_secret):
        assert post(known.v1, key_secret, chat()).status_code == 200
    key_revoke(key=revoked, actor=user, reason="test")
    # The new worker's database does not answer (nothing listens there).
    new = start_gateway_process([{"url": fake.url, "base_model": "tiny"}], tmp_path / "new.log",
                                DATABASE_URL="postgres://postgres@127.0.0.1:9/unreachable")
    try:
        served = post(new.v1, secret, chat())
        assert served.status_code == 200, served.text
        assert fake.stats()["last_request"]["model"] == f"t{user.tenant.pk}-v1"
        assert [post(new.v1, s, chat()).status_code for s in (revoked_secret, unseen_secret)] == [503, 503]
    finally:
        new.stop()


# --- a non-streamed client that goes away ------------------------------------------------------------------


def test_a_non_streamed_client_that_disconnects_frees_its_slot_and_cancels_the_upstream(gateway, fake):
    _, secret = make_key(make_user(), concurrency_limit=1)
    with pytest.raises(httpx.ReadTimeout):
        post(gateway.v1, secret, chat(fake_fault="sleep", fake_sleep=20), timeout=1.0)
    wait_until(lambda: fake.stats()["aborted"] == 1, timeout=5)
    started = time.monotonic()
    assert post(gateway.v1, secret, chat()).status_code == 200  # the slot is free: no 429
    assert time.monotonic() - started < 5
    record = next(r for r in gateway.spy.wait_for(2) if r.http_status == 499)
    assert record.error == "client disconnected" and record.status == "failed"


# --- OpenClaw as it really sends ---------------------------------------------------------------------------

SESSION_A = "3f2b8c1e-5d6a-4e7f-9a0b-1c2d3e4f5a6b"
SESSION_B = "9a8b7c6d-1111-4222-8333-444455556666"
SYSTEM = {"role": "system", "content": "You are a personal assistant running inside OpenClaw. Heartbeats: "
                                       "reply HEARTBEAT_OK when nothing needs attention."}
HEARTBEAT = ("Follow the heartbeat monitor scratch context when provided. Recurring tasks are automations; "
             "create or change their schedules with the automations tool, not heartbeat scratch. Do not "
             "infer or repeat old tasks from prior chats. If nothing needs attention, reply NO_REPLY.")
MEMORY_FLUSH = ("Pre-compaction memory flush. Store durable memories now (use memory/2026-12-01.md). "
                "If nothing to store, reply with NO_REPLY.")


def openclaw_user(text: str, session: str) -> dict:
    return {"role": "user", "content": f"[Tue 2026-12-01 08:27 UTC] {text}\n\nRuntime: agent=main | "
                                       f"session=agent:main:main | sessionId={session} | host=ci | os=linux"}


def test_openclaw_traffic_without_headers_lands_in_its_sessions_with_its_turn_types(gateway_factory, fake):
    gateway = gateway_factory([fake.url], real_capture=True)
    owner = make_user()
    _, secret = make_key(owner)
    first = [SYSTEM, openclaw_user("Fix the failing test", SESSION_A)]
    requests = [
        ("main A1", first),
        ("main A2", [*first, {"role": "assistant", "content": "Done."},
                     {"role": "user", "content": "[Tue 2026-12-01 08:29 UTC] Now the README"}]),
        ("heartbeat", [SYSTEM, openclaw_user(HEARTBEAT, SESSION_A)]),
        ("memory flush", [*first, {"role": "assistant", "content": "Done."},
                          {"role": "user", "content": MEMORY_FLUSH}]),
        ("compaction", [{"role": "system", "content": "You are a context summarization assistant. Your task "
                                                      "is to read a conversation"},
                        {"role": "user", "content": "summarise"}]),
        ("main B1", [SYSTEM, openclaw_user("Plan my week", SESSION_B)]),
    ]
    for what, messages in requests:
        # As OpenClaw 2026.9 sends them: streamed with include_usage, numeric session fields never refused.
        body = {"model": "clawhub-personal", "messages": messages, "stream": True,
                "stream_options": {"include_usage": True}}
        if what == "main B1":
            body["session_done"] = 0  # any JSON type is coerced
        response = post(gateway.v1, secret, body)
        assert response.status_code == 200, (what, response.text)
    turns = wait_until(lambda: (t := list(Turn.objects.filter(user=owner).select_related("session")
                                          .order_by("created_at"))) and len(t) == len(requests) and t,
                       timeout=20)
    got = [(t.session.external_id, t.turn_type) for t in turns]
    assert got[0] == (SESSION_A, "main") and got[1] == (SESSION_A, "main")
    assert got[2] == (SESSION_A, "side")  # heartbeat
    assert got[3] == (SESSION_A, "side")  # memory flush, inside the session it belongs to
    assert got[4][1] == "side"  # compaction carries no session at all
    assert got[5] == (SESSION_B, "main")
    assert Session.objects.filter(user=owner, external_id__in=[SESSION_A, SESSION_B]).count() == 2
