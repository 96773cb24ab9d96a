"""Usage metering: daily rows per key and model equal the sums of the records, even with two writers."""

import threading
from collections import defaultdict
from datetime import UTC, datetime

import pytest
from django.db import connection, connections

from clawhub.conversations.capture.store import capture_store
from clawhub.usage import services
from clawhub.usage.models import UsageDaily
from clawhub.usage.services import usage_record
from tests.conversations.conftest import make_record, user
from tests.factories import make_key


def _expected(records):
    sums = defaultdict(lambda: defaultdict(float))
    for r in records:
        row = sums[(r.key_id, r.model)]
        row["requests"] += 1
        row["errors"] += r.status == "failed"
        row["prompt_tokens"] += r.prompt_tokens
        row["completion_tokens"] += r.completion_tokens
        row["latency_ms_sum"] += r.latency_ms
        row["streams"] += r.stream
    return sums


def _actual():
    rows = {}
    for row in UsageDaily.objects.all():
        rows[(row.key_id, row.model)] = {
            "requests": row.requests,
            "errors": row.errors,
            "prompt_tokens": row.prompt_tokens,
            "completion_tokens": row.completion_tokens,
            "latency_ms_sum": row.latency_ms_sum,
            "streams": row.streams,
        }
    return rows


@pytest.mark.django_db
def test_usage_equals_the_sum_of_the_records_side_turns_and_failures_included(key):
    other = make_key()[0]
    records = [
        make_record(key, [user("a")], stream=True, ttft_ms=20.0),
        make_record(key, [user("Read HEARTBEAT.md")], stream=True, ttft_ms=30.0),
        make_record(key, [user("b")], status="failed"),
        make_record(key, [user("c")], model="base"),
        make_record(other, [user("d")]),
    ]
    capture_store(records[:2])
    capture_store(records[2:])
    assert _actual() == {k: dict(v) for k, v in _expected(records).items()}
    row = UsageDaily.objects.get(key=key, model="clawhub-personal")
    assert (
        row.ttft_ms_sum == 50.0
        and row.errors == 1
        and row.user == key.owner
        and row.tenant == key.owner.tenant
    )
    assert row.day == datetime.fromtimestamp(records[0].started_at, tz=UTC).date()


@pytest.mark.django_db
def test_group_keys_meter_against_the_group(db):
    from tests.factories import make_group

    group = make_group()
    group_key = make_key(group.created_by, group=group)[0]
    usage_record(records=[make_record(group_key, [user("x")])])
    row = UsageDaily.objects.get()
    assert row.group == group and row.tenant == group.tenant and row.model == f"clawhub-group-{group.slug}"


@pytest.mark.django_db
def test_the_portable_increment_path_adds_up_too(key, monkeypatch):
    monkeypatch.setattr(connections["default"], "vendor", "other")
    monkeypatch.setattr(services, "_upsert", None)  # must not be reached
    records = [make_record(key, [user(str(i))]) for i in range(4)]
    usage_record(records=records[:1])
    usage_record(records=records[1:])
    monkeypatch.undo()
    assert _actual() == {k: dict(v) for k, v in _expected(records).items()}


@pytest.mark.django_db(transaction=True)
def test_two_threads_writing_at_once_lose_no_increment(monkeypatch):
    from clawhub.conversations import hooks

    monkeypatch.setattr(hooks, "on_turn_ready_for_judging", lambda ids: None)  # no judge tasks from this test
    key = make_key()[0]
    per_thread = [
        [make_record(key, [user(f"t{t} r{i}")], session_id=f"shared-{i % 3}") for i in range(120)]
        for t in range(2)
    ]
    barrier = threading.Barrier(2)
    errors = []

    def write(records):
        try:
            barrier.wait()
            for start in range(0, len(records), 10):
                capture_store(records[start : start + 10])
        except Exception as exc:  # pragma: no cover - reported below
            errors.append(exc)
        finally:
            connection.close()

    threads = [threading.Thread(target=write, args=(records,)) for records in per_thread]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert not errors
    everything = [r for records in per_thread for r in records]
    assert _actual() == {k: dict(v) for k, v in _expected(everything).items()}

    from clawhub.conversations.models import Turn

    # Both threads wrote into the same three sessions; the session row lock numbered their turns one by one.
    assert Turn.objects.count() == 240
    for session_id in Turn.objects.values_list("session_id", flat=True).distinct():
        indexes = list(Turn.objects.filter(session_id=session_id).values_list("index", flat=True))
        assert indexes == list(range(80))


@pytest.mark.django_db
def test_the_batch_is_summed_before_it_reaches_the_database(key, django_assert_num_queries):
    records = [make_record(key, [user(str(i))], model=f"m{i % 3}") for i in range(30)]
    with django_assert_num_queries(1):
        usage_record(records=records)
    assert UsageDaily.objects.count() == 3
    assert set(services.SUMMED) <= {f.name for f in UsageDaily._meta.fields}
