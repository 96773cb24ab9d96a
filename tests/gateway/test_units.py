"""Quotas (Redis and in-process), identity extraction and key-cache invalidation, without HTTP."""

import asyncio

import pytest
from django.conf import settings

from clawhub.gateway.auth import KeyInfo
from clawhub.gateway.errors import GatewayError
from clawhub.gateway.identity import extract_identity
from clawhub.gateway.quotas import AdapterGeneration, AdapterMoved, GroupLimits, LocalLimiter, RedisLimiter
from tests.gateway.conftest import inside_one_minute


def key_info(key_id=1, group_id=None, **limits) -> KeyInfo:
    return KeyInfo(key_id=key_id, user_id=1, tenant_id=1, group_id=group_id, model_id="clawhub-personal",
                   allowed_models=frozenset(), rpm=limits.get("rpm"), tpm=limits.get("tpm"),
                   concurrency=limits.get("concurrency"), expires_at=None,
                   generation_key=f":1:keygen:{key_id}")


def limiters():
    return [lambda: RedisLimiter(settings.REDIS_URL, GroupLimits(concurrency=2), slot_ttl=600),
            lambda: LocalLimiter(GroupLimits(concurrency=2), slot_ttl=600)]


@pytest.mark.parametrize("make", limiters(), ids=["redis", "local"])
def test_limiters_apply_rpm_tpm_and_concurrency_alike(make):
    async def run():
        limiter = make()
        try:
            rpm = key_info(101, rpm=2)
            inside_one_minute()
            await limiter.admit(rpm, "a", None)
            await limiter.admit(rpm, "b", None)
            with pytest.raises(GatewayError) as exc:
                await limiter.admit(rpm, "c", None)
            assert exc.value.status == 429 and 1 <= exc.value.retry_after <= 60

            conc = key_info(102, concurrency=1)
            await limiter.admit(conc, "x", None)
            with pytest.raises(GatewayError) as exc:
                await limiter.admit(conc, "y", None)
            assert exc.value.retry_after == 1
            await limiter.release(conc, "x", 0)
            await limiter.admit(conc, "y", None)

            tpm = key_info(103, tpm=100)
            await limiter.admit(tpm, "t1", None)
            await limiter.release(tpm, "t1", 100)  # tokens land after the response
            with pytest.raises(GatewayError):
                await limiter.admit(tpm, "t2", None)

            # Group keys also count against the group's limits (concurrency 2 here), across keys.
            await limiter.admit(key_info(104, group_id=9), "g1", None)
            await limiter.admit(key_info(105, group_id=9), "g2", None)
            with pytest.raises(GatewayError):
                await limiter.admit(key_info(106, group_id=9), "g3", None)
            await limiter.admit(key_info(107), "personal", None)

            # A tenant's adapter generation that moved: refused without counting (rpm=1 still free after).
            from clawhub.adapters.cache import (
                adapter_cache_generation,
                adapter_cache_generation_key,
                adapter_cache_invalidate,
            )

            current = await asyncio.to_thread(adapter_cache_generation, tenant_id=108)
            await asyncio.to_thread(adapter_cache_invalidate, tenant_id=108)
            moved = AdapterGeneration(108, adapter_cache_generation_key(tenant_id=108), current)
            once = key_info(108, rpm=1)
            with pytest.raises(AdapterMoved):
                await limiter.admit(once, "a1", None, adapter="t108-v1", adapter_generation=moved)
            now_at = await asyncio.to_thread(adapter_cache_generation, tenant_id=108)
            await limiter.admit(once, "a2", None, adapter="t108-v1",
                                adapter_generation=AdapterGeneration(108, moved.key, now_at))
        finally:
            await limiter.close()

    asyncio.run(run())


def test_redis_admission_reports_a_moved_generation_without_counting():
    from clawhub.keys.cache import key_cache_invalidate

    async def run(expected):
        limiter = RedisLimiter(settings.REDIS_URL, GroupLimits(), slot_ttl=600)
        try:
            return await limiter.admit(key_info(201, rpm=1), "r1", expected)
        finally:
            await limiter.close()

    from django.core.cache import cache

    info = key_info(201)
    assert info.generation_key == cache.make_key("keygen:201")
    assert asyncio.run(run("")) == (True, "0")
    key_cache_invalidate(key_id=201)
    # Stale generation: refused without counting, so the retry after a fresh lookup is not over rpm=1.
    admitted, generation = asyncio.run(run("0"))
    assert not admitted and generation != "0"
    with pytest.raises(GatewayError):
        asyncio.run(run(generation))  # rpm=1 was used by the first call only


def test_identity_from_marker_in_content_parts_and_precedence():
    body = {"session_id": "body", "messages": [
        {"role": "system",
         "content": [{"type": "text", "text": "Hi.\n[RL-TRAINING-META] session_id=m1 turn_type=side"}]},
        {"role": "user", "content": "q"}]}
    identity = extract_identity({}, body)
    assert (identity.session_id, identity.turn_type) == ("body", "side")
    assert body["messages"][0]["content"][0]["text"] == "Hi." and "session_id" not in body
    headers = {b"x-session-id": b"hdr", b"x-turn-type": b"main", b"x-session-done": b"true"}
    identity = extract_identity(headers, {"messages": [{"role": "user", "content": "q"}]})
    assert (identity.session_id, identity.turn_type, identity.session_done) == ("hdr", "main", True)
    # Never refused (tests/gateway/test_identity.py has the coercion rules): an unknown type is inferred.
    assert extract_identity({}, {"turn_type": "other"}).turn_type is None


def test_a_key_lookup_survives_an_unreadable_generation(db, monkeypatch):
    """The shared cache down while a key is looked up: the key is served (unchecked, as quotas fail open)
    rather than refused, and its next lookup reads the generation again."""
    from clawhub.gateway import auth
    from clawhub.keys import cache as key_cache
    from tests.factories import make_key

    key, secret = make_key()
    info, generation = auth.resolve_key_blocking(secret)
    assert info.key_id == key.pk and generation not in (None, key_cache.ABSENT)

    def down(**_kwargs):
        raise ConnectionError("cache down")

    monkeypatch.setattr(key_cache, "key_cache_generation", down)
    info, generation = auth.resolve_key_blocking(secret)
    assert info.key_id == key.pk and generation is None


def test_a_rotated_out_secret_expires_in_the_cache_with_its_grace_window(db, settings):
    """The old secret's lookup is cached like any other: it carries the grace window's end as its expiry, so
    it stops at that moment rather than up to GATEWAY_KEY_CACHE_SECONDS later."""
    from datetime import timedelta

    from clawhub.gateway import auth
    from clawhub.keys.selectors import key_resolve
    from clawhub.keys.services import key_rotate
    from tests.factories import make_key

    settings.KEY_ROTATION_GRACE = timedelta(hours=1)
    key, old = make_key()
    assert auth.resolve_key_blocking(old)[0].expires_at is None
    new = key_rotate(key=key, actor=key.owner)
    grace_end = key_resolve(secret=old).valid_until
    assert auth.resolve_key_blocking(old)[0].expires_at == grace_end.timestamp()
    assert auth.resolve_key_blocking(new)[0].expires_at is None


@pytest.mark.django_db(transaction=True)
def test_the_gateways_read_threads_keep_their_database_connection():
    """With DATABASE_CONN_MAX_AGE=0 (the web's default) Django's close_old_connections reconnected for every
    key or adapter read the gateway made; each read thread now keeps its connection while it works."""
    from django.db import connection

    from clawhub.gateway.dbreads import DbRunner

    def backend_pid() -> int:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            return cursor.fetchone()[0]

    assert settings.DATABASES["default"]["CONN_MAX_AGE"] == 0
    runner = DbRunner(threads=1)

    async def reads() -> set[int]:
        return {await runner.run(backend_pid) for _ in range(3)}

    try:
        assert len(asyncio.run(reads())) == 1
    finally:
        runner.close()


def test_the_small_redis_client_pipelines_calls_in_order_and_recovers_from_a_timeout():
    """clawhub.core.resp, which admission and release go through: concurrent callers share one connection and
    each gets its own reply; a script Redis lacks is sent once; a reply error is redis-py's; a call that
    times out drops the connection, so its late reply cannot answer the next call."""
    import redis

    from clawhub.core.resp import RespClient, Script

    async def run():
        client = RespClient(settings.REDIS_URL, timeout=0.3)
        try:
            await client.call("DEL", "resp:n", "resp:list")
            replies = await asyncio.gather(*(client.call("INCR", "resp:n") for _ in range(200)))
            assert sorted(replies) == list(range(1, 201))
            script = Script("return {redis.call('GET', KEYS[1]), ARGV[1]}")
            await client.call("SCRIPT", "FLUSH")
            assert await client.evalsha(script, ["resp:n"], ["x"]) == [b"200", b"x"]  # EVAL, then cached
            assert await client.evalsha(script, ["resp:n"], [1.5]) == [b"200", b"1.5"]
            with pytest.raises(redis.ResponseError):
                await client.call("INCR", "resp:n", "extra")
            with pytest.raises(redis.TimeoutError):
                await client.call("BLPOP", "resp:list", 2)  # blocks past the timeout
            assert await client.call("GET", "resp:n") == b"200"
            await client.call("DEL", "resp:n")
        finally:
            await client.close()

    asyncio.run(run())


def test_a_chat_replys_prompt_ids_are_cut_out_as_bytes_and_written_back_unchanged():
    """An agent's 15k prompt ids are not parsed: split_prompt_ids cuts the list out of the body as vLLM's JSON
    text (RawIds; capture parses it once, and drops text that is not a list of uint32); a body it cannot cut
    is left whole, and a cut that leaves the rest unparseable is undone by parse_reply."""
    import orjson

    from clawhub.conversations.storage import pack_ids
    from clawhub.gateway.proxy import parse_reply, split_prompt_ids

    for body in ({"id": "a", "prompt_token_ids": [1, 20, 0], "choices": []},
                 {"prompt_token_ids": [7, 8], "usage": {"prompt_tokens": 2}}, {"prompt_token_ids": []},
                 {"content": '"prompt_token_ids":[9]', "prompt_token_ids": [5]}):
        rest, ids = split_prompt_ids(orjson.dumps(body))
        assert len(ids) == len(body["prompt_token_ids"]) and ids == body["prompt_token_ids"]
        assert ids.packed() == pack_ids(body["prompt_token_ids"])
        assert b"prompt_token_ids\":[" not in rest.replace(b'\\"', b"")
        given_back = {**orjson.loads(rest), "prompt_token_ids": orjson.Fragment(ids.raw)}
        assert orjson.loads(orjson.dumps(given_back)) == body
        assert parse_reply(orjson.dumps(body), True) == (orjson.loads(rest), ids)
        assert parse_reply(orjson.dumps(body), False) == (body, None)  # completions: ids are in the choice
    # Not checked when cut: capture's one parse finds what is not a list of uint32, and stores no ids.
    for raw, packed in ((b'{"prompt_token_ids":[1, 2]}', pack_ids([1, 2])),
                        (b'{"prompt_token_ids":[01,2]}', None), (b'{"prompt_token_ids":[1,,2]}', None),
                        (b'{"prompt_token_ids":[-1,2]}', None), (b'{"prompt_token_ids":[4294967296]}', None),
                        (b'{"prompt_token_ids":[1.5]}', None), (b'{"prompt_token_ids":[{"a":1}]}', None)):
        rest, ids = split_prompt_ids(raw)
        assert rest == b"{}" and ids.packed() == packed, raw
    for raw in (b'{"prompt_token_ids":null}', b'{"prompt_token_ids":[1],"x":{"prompt_token_ids":[1]}}'):
        assert split_prompt_ids(raw) == (raw, None)
    # A list holding a "]" in a string (never vLLM's): the cut breaks the rest, so the whole body is parsed.
    odd = b'{"prompt_token_ids":["a]"],"x":1}'
    assert split_prompt_ids(odd)[1] is not None
    assert parse_reply(odd, True) == ({"prompt_token_ids": ["a]"], "x": 1}, None)


def test_the_upstream_client_reuses_a_connection_and_reads_a_large_reply_whole():
    """clawhub.gateway.h1client: a kept-alive connection serves the next request; a 1 MB reply (past the
    256 KB at which reading pauses for a slow reader) arrives whole, read at once (and again, as forwarding
    reads a 400) or piece by piece, plain or chunked; a connection refused is httpx's ConnectError."""
    import httpx

    from clawhub.gateway.h1client import UpstreamClient
    from tests.ports import free_port

    body = bytes(range(256)) * 4096  # 1 MB

    async def run():
        connections = []

        async def serve(reader, writer):
            connections.append(writer)
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                size = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
                request = await reader.readexactly(size)
                if request == b"chunked":
                    writer.write(b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n")
                    for at in range(0, len(body), 100_000):
                        part = body[at:at + 100_000]
                        writer.write(b"%x\r\n%s\r\n" % (len(part), part))
                    writer.write(b"0\r\n\r\n")
                else:
                    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/octet-stream\r\n"
                                 b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
                await writer.drain()

        server = await asyncio.start_server(serve, "127.0.0.1", 0)
        url = f"http://127.0.0.1:{server.sockets[0].getsockname()[1]}/v1/x"
        client = UpstreamClient(keepalive=4.0, connect_timeout=2, read_timeout=5)
        try:
            response = await client.post(url, b"plain", {"content-type": "text/plain"})
            assert response.status_code == 200
            assert response.headers.get("content-type") == "application/octet-stream"
            assert await response.aread() == body
            assert await response.aread() == body  # read again: the same body
            await response.aclose()
            for kind in (b"plain", b"chunked"):
                response = await client.post(url, kind, {})
                parts = []
                async for part in response.aiter_raw():
                    parts.append(part)
                    await asyncio.sleep(0.001)  # a slow reader
                await response.aclose()
                assert b"".join(parts) == body
            assert len(connections) == 1
            with pytest.raises(httpx.ConnectError):
                await client.post(f"http://127.0.0.1:{free_port()}/v1/x", b"{}", {})
        finally:
            await client.aclose()
            server.close()

    asyncio.run(run())
