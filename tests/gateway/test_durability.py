"""Nothing captured is lost: the production server (gunicorn, one uvicorn worker) under paced load, with its
PostgreSQL stopped, its Redis restarted, the server itself stopped with SIGTERM or killed with SIGKILL, and
the capture consumer killed with SIGKILL.

The tests own their data stores (a throwaway PostgreSQL cluster and a Redis with AOF, each on its own port,
made once for the module), the fake upstream, and the capture consumer process. Each request is a session of
its own (X-Session-Id), so "exactly one stored turn per 2xx response" is checked request by request, and usage
against the number of turns.
"""

import os
import signal
import time

import httpx
import pytest

from clawhub.conversations.capture.records import decode
from tests.gateway.conftest import start_fake, wait_until
from tests.gateway.durability import (
    METRICS_TOKEN,
    PacedLoad,
    ThrowawayPostgres,
    ThrowawayRedis,
    app_env,
    consumer_process,
    gateway_process,
    make_keys,
    manage,
    turns_by_session,
    usage_requests,
    wait_serving,
)

# Seconds: the database away past every cache lifetime and the consumer's longest backoff.
DATABASE_OUTAGE = 60
REDIS_OUTAGE = 30


@pytest.fixture(scope="module")
def stores():
    pg, rds = ThrowawayPostgres(), ThrowawayRedis(durable=True)
    try:
        pg.init()
        rds.start()
        yield pg, rds
    finally:
        rds.destroy()
        pg.destroy()


@pytest.fixture(scope="module")
def upstream():
    # Streams take ~0.5 s (8 chunks), so a stop or a kill always finds some in flight.
    fake = start_fake(FAKE_LOAD_DELAY="0", FAKE_CHUNK_DELAY="0.06")
    yield fake
    fake.stop()


@pytest.fixture(scope="module")
def migrated(stores, upstream, tmp_path_factory):
    pg, rds = stores
    env = app_env(pg, rds, upstream.url, tmp_path_factory.mktemp("spool"))
    manage(env, "migrate", "--noinput")
    return env


@pytest.fixture
def stack(migrated, tmp_path):
    """The gateway and the consumer on the module's stores; a fresh user and keys per test."""
    env = {**migrated, "CLAWHUB_CAPTURE_SPOOL_DIR": str(tmp_path / "spool")}
    keys = make_keys(env)
    gateway, base = gateway_process(env, tmp_path)
    consumer = consumer_process(env, tmp_path)
    gateway.start()
    consumer.start()
    started = [gateway, consumer]
    try:
        wait_serving(gateway, base)
        yield {"env": env, "keys": keys, "gateway": gateway, "base": base, "consumer": consumer,
               "folder": tmp_path, "started": started}
    finally:
        for proc in started:
            proc.stop()


def settle(pg, load: PacedLoad, expected: int, timeout: float = 90) -> dict[str, int]:
    """Waits until the consumer stored ``expected`` of this load's turns (and nothing more arrives)."""
    wait_until(lambda: sum(turns_by_session(pg, load.prefix).values()) >= expected, timeout=timeout,
               interval=0.5)
    time.sleep(1.5)  # a duplicate would arrive with the rest
    return turns_by_session(pg, load.prefix)


def assert_exactly_once(turns: dict[str, int], ok) -> None:
    missing = [s.session for s in ok if turns.get(s.session, 0) == 0]
    duplicated = {k: v for k, v in turns.items() if v > 1}
    assert not missing, f"{len(missing)} answered requests have no stored turn: {missing[:10]}"
    assert not duplicated, f"turns stored twice: {duplicated}"


def metric(base: str, name: str) -> float:
    text = httpx.get(f"{base}/metrics", headers={"Authorization": f"Bearer {METRICS_TOKEN}"}, timeout=10).text
    return sum(float(line.rsplit(" ", 1)[1]) for line in text.splitlines()
               if line.startswith(name + "{") or line.startswith(name + " "))


def test_database_stopped_for_a_minute(stores, stack):
    pg, _ = stores
    load = PacedLoad(stack["base"], stack["keys"], prefix="db", unseen_every=4)
    load.start()
    time.sleep(4)
    pg.stop()
    stopped_at = time.monotonic()
    load.send_unseen.set()
    # The pod stays in the Service: the gateway's readiness holds all through the outage (asked three times,
    # the last near its end), the web app's does not.
    gateway_ready, web_ready = [], []
    for wait in (10, 25, 24):
        time.sleep(wait)
        gateway_ready.append(httpx.get(f"{stack['base']}/readyz/gateway", timeout=10))
        web_ready.append(httpx.get(f"{stack['base']}/readyz", timeout=10))
    time.sleep(max(0.0, stopped_at + DATABASE_OUTAGE - time.monotonic()))
    load.send_unseen.clear()
    outage = (stopped_at, time.monotonic())
    pg.start()
    time.sleep(5)
    load.stop()

    known = [s for s in load.sent if s.key == "known"]
    unseen = [s for s in load.sent if s.key == "unseen"]
    during = [s for s in known if outage[0] + 0.5 < s.started < outage[1]]
    statuses = {s.status for s in load.sent}  # None: the request failed at the client (its error is kept)
    assert 500 not in statuses, [s.body for s in load.sent if s.status == 500][:3]
    assert [r.status_code for r in gateway_ready] == [200, 200, 200], [r.text for r in gateway_ready]
    assert all(r.status_code == 503 and "database" in r.json()["failed"] for r in web_ready)
    # Known keys (and their adapter) are served from the last good lookup all through the outage.
    assert len(during) >= 0.4 * load.rate * DATABASE_OUTAGE, len(during)
    assert all(s.status == 200 and s.done_at for s in during), \
        sorted({(s.status, s.error) for s in during if s.status != 200 or not s.done_at})
    assert all(s.status == 200 and s.done_at for s in known), \
        sorted({(s.status, s.error, s.body[:80]) for s in known if s.status != 200 or not s.done_at})
    # A key the gateway never saw cannot be checked: 503 with Retry-After, never 500 or 401.
    assert unseen and all(s.status == 503 and s.retry_after for s in unseen), \
        sorted({(s.status, s.retry_after) for s in unseen})

    turns = settle(pg, load, expected=len(known))
    assert_exactly_once(turns, load.ok())
    assert sum(turns.values()) == len(known)
    assert usage_requests(pg, stack["keys"]["tenant"]) == len(known)
    # The consumer retried through the outage, and /metrics says so.
    assert metric(stack["base"], "clawhub_capture_retries") >= 1
    assert metric(stack["base"], "clawhub_gateway_stale_served_total") >= 1
    assert metric(stack["base"], "clawhub_capture_backlog") == 0
    print(f"\ndatabase outage ({outage[1] - outage[0]:.0f} s): {len(load.sent)} requests, {len(known)} "
          f"known-key 200s served ({len(during)} during the outage), {len(unseen)} unseen-key 503s, "
          f"{sum(turns.values())} turns stored, 0 lost, 0 duplicated")


def test_redis_stopped_for_half_a_minute(stores, stack):
    """Quotas fail open, finished turns go to the gateway's spool, the consumer waits; once Redis is back
    the spool is forwarded and every served request is stored once."""
    pg, rds = stores
    load = PacedLoad(stack["base"], stack["keys"], prefix="redis")
    load.start()
    time.sleep(4)
    rds.stop()
    time.sleep(REDIS_OUTAGE)
    rds.start()
    time.sleep(5)
    load.stop()

    assert all(s.status == 200 and s.done_at for s in load.sent), \
        sorted({(s.status, s.error, s.body[:80]) for s in load.sent if s.status != 200 or not s.done_at})
    turns = settle(pg, load, expected=len(load.sent))
    assert_exactly_once(turns, load.ok())
    assert sum(turns.values()) == len(load.sent)
    assert usage_requests(pg, stack["keys"]["tenant"]) == len(load.sent)
    # What the gateway could not XADD while Redis was down went to its spool and was forwarded afterwards.
    stats = {k.decode(): int(v) for k, v in rds.client().hgetall("clawhub:capture:stats").items()
             if k != b"heartbeat"}
    assert stats.get("forwarded", 0) >= 1, stats
    print(f"\nredis outage ({REDIS_OUTAGE} s): {len(load.sent)} requests served, all 200, "
          f"{sum(turns.values())} turns stored, 0 lost, {stats.get('forwarded')} went through the local "
          "spool")


def test_sigterm_mid_load_loses_no_finished_turn(stores, stack):
    pg, _ = stores
    load = PacedLoad(stack["base"], stack["keys"], prefix="term")
    load.start()
    time.sleep(4)
    gateway = stack["gateway"]
    signalled = time.monotonic()
    gateway.process.send_signal(signal.SIGTERM)  # to gunicorn's master, as Kubernetes and compose do
    assert gateway.wait(40) == 0
    in_flight = [s for s in load.sent if s.started < signalled and s.headers_at and s.headers_at < signalled]
    # The same server starts again (a rolling restart); the load goes on against it.
    again, base = gateway_process(stack["env"], stack["folder"])
    stack["started"].append(again)
    again.start()
    wait_serving(again, base)
    load.retarget(base)
    time.sleep(3)
    load.stop()

    ok = load.ok()
    assert 500 not in {s.status for s in load.sent}
    # Streams open at SIGTERM were finished, not cut.
    cut = [s for s in in_flight if not (s.status == 200 and s.done_at)]
    assert in_flight and not cut, f"{len(cut)} of {len(in_flight)} open streams were cut"
    turns = settle(pg, load, expected=len(ok))
    assert_exactly_once(turns, ok)
    print(f"\nSIGTERM: {len(load.sent)} requests, {len(ok)} answered, {len(in_flight)} open at the signal "
          f"(all finished), {sum(turns.values())} turns stored, 0 finished turns lost")


def test_sigkill_loses_only_what_was_in_flight_and_says_so(stores, stack):
    pg, rds = stores
    load = PacedLoad(stack["base"], stack["keys"], prefix="kill")
    load.start()
    time.sleep(4)
    gateway = stack["gateway"]
    killed = time.monotonic()
    gateway.signal(signal.SIGKILL)
    gateway.wait(10)
    time.sleep(0.5)
    load.stop()  # everything after the kill fails to connect
    open_at_kill = [s for s in load.sent if s.started < killed and not (s.done_at and s.done_at < killed)]
    answered = [s for s in load.ok() if s.done_at < killed]

    # The next process on the same spool folder finds the dead one's journal and counts what it left open.
    again, base = gateway_process(stack["env"], stack["folder"])
    stack["started"].append(again)
    again.start()
    wait_serving(again, base)
    stats = rds.client()
    wait_until(lambda: stats.hget("clawhub:capture:stats", "lost_in_flight") is not None, timeout=20)
    lost = int(stats.hget("clawhub:capture:stats", "lost_in_flight"))
    assert "requests in flight" in again.log()

    turns = settle(pg, load, expected=len(answered))
    stored = sum(turns.values())
    answered_lost = [s for s in answered if turns.get(s.session, 0) == 0]
    assert not {k: v for k, v in turns.items() if v > 1}
    # Lost = the admitted requests that never finished, as counted from the journal; each one was still open
    # at the kill (an answered request lost is possible only in the instant between its last byte and its
    # hand-off, and would be counted here too). The count errs on the side of reporting: a turn whose hand-off
    # completed in the instant before the kill, before the journal marked it done, is stored and still
    # counted (seen once in three runs: 8 reported for 7 open without a stored turn).
    assert 0 < lost <= len(open_at_kill), (lost, len(open_at_kill))
    assert len(answered_lost) <= lost
    print(f"\nSIGKILL: {len(load.sent)} requests, {len(answered)} answered before the kill "
          f"({len(answered_lost)} of them lost), {len(open_at_kill)} open at the kill, {lost} reported lost "
          f"in flight, {stored} turns stored")


def test_a_killed_gateway_worker_is_replaced_and_nothing_it_answered_is_lost(stores, stack):
    """SIGKILL of the worker alone (an OOM kill): gunicorn's master starts another on the same socket, which
    finds the dead one's spool and journal, forwards what it had spooled and counts what it left in flight.
    Requests that fail are only those the dead worker had open; the load goes on against the same address."""
    pg, rds = stores
    stats = rds.client()
    lost_before = int(stats.hget("clawhub:capture:stats", "lost_in_flight") or 0)
    load = PacedLoad(stack["base"], stack["keys"], prefix="wkill")
    load.start()
    time.sleep(4)
    gateway = stack["gateway"]
    (worker,) = gateway.children()
    killed = time.monotonic()
    os.kill(worker, signal.SIGKILL)
    wait_until(lambda: gateway.children() not in ([], [worker]), timeout=30, interval=0.1)
    wait_serving(gateway, stack["base"])
    replaced = time.monotonic()
    time.sleep(4)
    load.stop()

    assert gateway.process.poll() is None  # the master lives on
    open_at_kill = [s for s in load.sent if s.started < killed and not (s.done_at and s.done_at < killed)]
    failed = [s for s in load.sent if not (s.status == 200 and s.done_at)]
    assert all(s in open_at_kill for s in failed), sorted({(s.status, s.error) for s in failed
                                                          if s not in open_at_kill})
    after = [s for s in load.sent if s.started > replaced]
    assert after and all(s.status == 200 and s.done_at for s in after)
    wait_until(lambda: int(stats.hget("clawhub:capture:stats", "lost_in_flight") or 0) > lost_before,
               timeout=20)
    lost = int(stats.hget("clawhub:capture:stats", "lost_in_flight")) - lost_before

    served = load.ok()
    answered = [s for s in served if s.done_at < killed]
    turns = settle(pg, load, expected=len(served) - lost)
    stored = sum(turns.values())
    served_lost = [s for s in served if turns.get(s.session, 0) == 0]
    assert not {k: v for k, v in turns.items() if v > 1}
    # A turn is handed off within milliseconds of its last byte: only one answered in that instant before the
    # kill can be lost, and it is counted with those in flight. None answered earlier, none after.
    assert 0 < lost <= len(open_at_kill), (lost, len(open_at_kill))
    assert len(served_lost) <= lost and all(killed - s.done_at < 1.0 for s in served_lost), \
        [(s.session, killed - s.done_at) for s in served_lost]
    assert usage_requests(pg, stack["keys"]["tenant"]) == stored
    print(f"\nworker SIGKILL: {len(load.sent)} requests, {len(served)} served ({len(answered)} before the "
          "kill), "
          f"{len(failed)} failed at the client (all open at the kill), {stored} turns stored, "
          f"{len(served_lost)} served and lost, {lost} reported lost in flight; replaced in "
          f"{replaced - killed:.1f} s")


def test_a_turn_the_database_refuses_is_dead_lettered_with_a_metric_and_the_rest_stored(stores, stack):
    """A store failure while the database answers (here PostgreSQL refusing a NUL character in the
    conversation, served all the same): the consumer retries it, then moves it to the dead-letter stream,
    which /metrics reports; it is metered, and every other turn is stored."""
    pg, rds = stores
    log = rds.client()
    dead_before = log.xlen("clawhub:capture:dead")
    load = PacedLoad(stack["base"], stack["keys"], prefix="poison")
    load.start()
    time.sleep(2)
    poisoned = []
    for i in range(2):
        session = f"refused-{i}"
        response = httpx.post(f"{stack['base']}/v1/chat/completions", timeout=30, json={
            "model": "clawhub-personal", "messages": [{"role": "user", "content": f"a NUL \u0000 here {i}"}]},
            headers={"Authorization": f"Bearer {stack['keys']['known']}", "X-Session-Id": session})
        assert response.status_code == 200, response.text
        poisoned.append(session)
    time.sleep(2)
    load.stop()

    served = load.ok()
    assert len(served) == len(load.sent)
    turns = settle(pg, load, expected=len(served))
    assert_exactly_once(turns, served)
    wait_until(lambda: log.xlen("clawhub:capture:dead") >= dead_before + 2, timeout=60, interval=0.5)
    letters = log.xrange("clawhub:capture:dead")[dead_before:]
    assert sorted(decode(fields[b"r"]).session_id for _, fields in letters) == poisoned
    assert turns_by_session(pg, "refused") == {}
    assert all(fields[b"reason"].startswith(b"failed 5 times") for _, fields in letters), letters
    assert metric(stack["base"], "clawhub_capture_dead_letters") >= dead_before + 2
    assert metric(stack["base"], "clawhub_capture_backlog") == 0
    # Served, so metered: the dead letters' usage too.
    assert usage_requests(pg, stack["keys"]["tenant"]) == len(served) + 2
    print(f"\nstore failure: {len(served) + 2} requests served, {sum(turns.values())} turns stored, "
          f"{len(letters)} dead-lettered (the refused ones), 0 lost")


def test_consumer_sigkill_mid_load_loses_nothing(stores, stack):
    """The consumer killed while it stores (a batch read and maybe committed, not yet acknowledged): a new one
    claims what the dead one had read, stores what was not committed and skips what was, so every answered
    request ends as exactly one turn and is metered once."""
    pg, rds = stores
    load = PacedLoad(stack["base"], stack["keys"], prefix="ckill")
    load.start()
    time.sleep(4)
    consumer, log = stack["consumer"], rds.client()
    # Killed while it holds records it read and has not acknowledged (it waits CAPTURE_BATCH_LINGER_MS for
    # more after a short read, so this comes within a few reads).
    wait_until(lambda: log.xpending("clawhub:capture", "capture")["pending"] > 0, timeout=10, interval=0.005)
    consumer.signal(signal.SIGKILL)
    consumer.wait(10)
    killed_at = time.monotonic()
    pending = log.xpending("clawhub:capture", "capture")["pending"]
    time.sleep(2)  # turns keep coming and wait in the stream
    again = consumer_process(stack["env"], stack["folder"])
    stack["started"].append(again)
    again.start()
    time.sleep(4)  # past CLAWHUB_CAPTURE_CLAIM_IDLE_SECONDS (3): the dead consumer's entries are claimed
    load.stop()

    served = load.ok()
    assert len(served) == len(load.sent), sorted({(s.status, s.error) for s in load.sent if s not in served})
    turns = settle(pg, load, expected=len(served))
    assert_exactly_once(turns, served)
    stored = sum(turns.values())
    assert stored == len(served)
    assert usage_requests(pg, stack["keys"]["tenant"]) == len(served)
    assert pending > 0 and log.xpending("clawhub:capture", "capture")["pending"] == 0
    before_kill = len([s for s in served if s.done_at < killed_at])
    print(f"\nconsumer SIGKILL: {len(served)} requests served ({before_kill} before the kill), {stored} "
          f"turns stored, {len(served) - stored} lost, {pending} records read by the killed consumer and not "
          "acknowledged (claimed by the next)")
