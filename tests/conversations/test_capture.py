"""capture_store: sessions (explicit and inferred), turn types, next-state links, closing, and bad records."""

import logging

import pytest

from clawhub.conversations import hooks
from clawhub.conversations.capture import store
from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session, Turn
from clawhub.conversations.selectors import turn_request
from clawhub.groups.models import Role
from clawhub.usage.models import UsageDaily
from tests.conversations.conftest import assistant, make_record, system, tool, tool_call, topic_session, user
from tests.factories import add_member, make_group, make_key

pytestmark = pytest.mark.django_db


@pytest.fixture
def judged(monkeypatch, django_capture_on_commit_callbacks):
    """Runs capture's on-commit callbacks and collects the turn ids handed to the judging hook."""
    calls: list[list[int]] = []
    monkeypatch.setattr(hooks, "on_turn_ready_for_judging", lambda ids: calls.append(list(ids)))

    class Judged:
        def store(self, records):
            before = len(calls)
            with django_capture_on_commit_callbacks(execute=True):
                capture_store(records)
            return [i for call in calls[before:] for i in call]

        @property
        def calls(self):
            return calls

    return Judged()


def turn(request_id: str) -> Turn:
    return Turn.objects.get(request_id=request_id)


def test_explicit_session_ids_group_turns_and_link_next_state(key, judged):
    first = make_record(key, [system(), user("write a haiku")], reply="An old pond...", session_id="s-1")
    second = make_record(key, [user("shorter please")], session_id="s-1")
    other = make_record(key, [user("unrelated")], session_id="s-2")
    ready = judged.store([first, second, other])

    session = Session.objects.get(external_id="s-1")
    assert not session.inferred and session.user_id == key.owner_id and session.key_id == key.pk
    assert list(session.turns.values_list("request_id", "index")) == [
        (first.request_id, 0),
        (second.request_id, 1),
    ]
    assert session.turn_count == 2
    linked = turn(first.request_id)
    assert linked.next_state == [user("shorter please")] and linked.next_state_at is not None
    assert turn(second.request_id).next_state is None
    assert turn(other.request_id).session.external_id == "s-2"
    assert ready == [linked.pk]


def test_turn_fields_are_stored_as_recorded(key):
    record = make_record(
        key,
        [user("hi")],
        reply="hello",
        token_ids=[5, 6, 7],
        logprobs=[-0.1, -0.2, -0.3],
        stream=True,
        ttft_ms=12.5,
        clamped_max_tokens=100,
    )
    capture_store([record])
    stored = turn(record.request_id)
    assert stored.clamped_max_tokens == 100
    assert stored.token_ids == [5, 6, 7] and stored.logprobs == [-0.1, -0.2, -0.3]
    assert stored.response[0]["message"]["content"] == "hello"
    # The messages are stored apart from the rest of the request (O(n) per session): read back through the
    # selector.
    assert turn_request(turn=stored) == {"messages": [user("hi")], "temperature": 0.6}
    assert (stored.prompt_tokens, stored.completion_tokens) == (
        record.prompt_tokens,
        record.completion_tokens,
    )
    assert stored.status == "complete" and stored.http_status == 200 and stored.ttft_ms == 12.5
    assert (
        stored.turn_type == "main"
        and stored.model == "clawhub-personal"
        and stored.tenant == key.owner.tenant
    )
    assert stored.created_at.timestamp() == pytest.approx(record.started_at)


def test_how_the_reply_was_sampled_is_recorded_with_the_defaults_the_server_used(key, settings):
    # The tiny model's generation_config.json and description name no sampling: what the request leaves out
    # is vLLM's neutral value, unless the operator says the server is started otherwise.
    from workers.base_models import TINY_MODEL_DIR

    settings.CLAWHUB_BASE_MODEL = str(TINY_MODEL_DIR)
    given = make_record(
        key, request={"messages": [user("hi")], "temperature": 0.6, "top_p": 0.95, "top_k": -1}
    )
    left_out = make_record(key, request={"messages": [user("hi again")]})
    capture_store([given, left_out])
    assert turn(given.request_id).sampling == {
        "temperature": 0.6, "top_p": 0.95, "top_k": 0, "logprobs_mode": "processed_logprobs", "defaulted": [],
    }
    assert turn(left_out.request_id).sampling == {
        "temperature": 1.0, "top_p": 1.0, "top_k": 0, "logprobs_mode": "processed_logprobs",
        "defaulted": ["temperature", "top_p", "top_k"],
    }
    settings.CLAWHUB_SERVED_SAMPLING = {"temperature": 0.7, "top_k": 20}
    settings.CLAWHUB_VLLM_LOGPROBS_MODE = "raw_logprobs"
    later = make_record(key, request={"messages": [user("and again")], "top_p": 0.8})
    capture_store([later])
    assert turn(later.request_id).sampling == {
        "temperature": 0.7, "top_p": 0.8, "top_k": 20, "logprobs_mode": "raw_logprobs",
        "defaulted": ["temperature", "top_k"],
    }


@pytest.mark.parametrize("same_batch", [True, False])
def test_inferred_continuation_with_canonical_variants(key, judged, same_batch):
    first = make_record(key, [system(), user("What is 2+2?")], reply="4")
    resent = [
        {"role": "system", "content": [{"type": "text", "text": "You are a helpful agent."}]},
        {"role": "user", "content": "What is 2+2?  ", "name": None},
        {"role": "assistant", "content": [{"type": "text", "text": "4"}], "tool_calls": None},
        user("And 3+3?"),
    ]
    second = make_record(key, resent, reply="6")
    third = make_record(key, [*resent, assistant("6"), user("thanks!")])
    if same_batch:
        judged.store([first, second, third])
    else:
        for record in (first, second, third):
            judged.store([record])

    sessions = Session.objects.filter(user=key.owner)
    assert sessions.count() == 1
    session = sessions.get()
    assert session.inferred and session.external_id.startswith("inf-")
    assert [t.request_id for t in session.turns.all()] == [
        first.request_id,
        second.request_id,
        third.request_id,
    ]
    assert turn(first.request_id).next_state == [user("And 3+3?")]
    assert turn(second.request_id).next_state == [user("thanks!")]
    ready = sorted(i for call in judged.calls for i in call)
    assert ready == sorted([turn(first.request_id).pk, turn(second.request_id).pk])


def test_a_changed_history_starts_a_new_session(key):
    first = make_record(key, [user("What is 2+2?")], reply="4")
    edited = make_record(key, [user("What is 2+2?"), assistant("5"), user("sure?")])
    capture_store([first])
    capture_store([edited])
    assert turn(first.request_id).session_id != turn(edited.request_id).session_id
    assert turn(first.request_id).next_state is None


def test_interleaved_sessions_link_to_their_own_previous_turn(key):
    a, b = topic_session("A"), topic_session("B")
    a1 = make_record(key, a[0], reply="about A")
    b1 = make_record(key, b[0], reply="about B")
    a2 = make_record(key, a[1], reply="more about A")
    b2 = make_record(key, b[1], reply="more about B")
    a3 = make_record(key, a[2])
    capture_store([a1, b1, a2])
    capture_store([b2, a3])

    assert turn(a1.request_id).session_id == turn(a2.request_id).session_id == turn(a3.request_id).session_id
    assert turn(b1.request_id).session_id == turn(b2.request_id).session_id != turn(a1.request_id).session_id
    assert turn(a1.request_id).next_state == [user("more A")]
    assert turn(a2.request_id).next_state == [user("done with A")]
    assert turn(b1.request_id).next_state == [user("more B")]
    assert turn(b2.request_id).next_state is None
    assert [t.index for t in Turn.objects.filter(session_id=turn(a1.request_id).session_id)] == [0, 1, 2]


def test_tool_results_are_the_next_state_of_the_turn_that_called_the_tools(key):
    calls = [tool_call("read", '{"path": "a"}', "c1"), tool_call("read", '{"path": "b"}', "c2")]
    asking = make_record(key, [user("compare a and b")], reply=None, tool_calls=calls)
    results = [tool("contents of a", "c1"), tool("ERROR: b not found", "c2")]
    answering = make_record(
        key, [user("compare a and b"), assistant(None, calls), *results], reply="b is missing"
    )
    capture_store([asking])
    capture_store([answering])
    assert turn(answering.request_id).session_id == turn(asking.request_id).session_id
    assert turn(asking.request_id).next_state == results


def test_session_done_closes_the_last_main_turn_without_next_state(key, judged):
    first = make_record(key, [user("hi")], reply="hello", session_id="s-done")
    last = make_record(
        key, [user("hi"), assistant("hello"), user("bye")], session_id="s-done", session_done=True
    )
    ready = judged.store([first, last])

    session = Session.objects.get(external_id="s-done")
    assert session.closed_at is not None and session.close_reason == "done"
    assert turn(first.request_id).next_state == [user("bye")]
    closed = turn(last.request_id)
    assert closed.closed_without_next and closed.next_state is None
    assert sorted(ready) == sorted([turn(first.request_id).pk, closed.pk])


def test_a_closed_session_opens_again_and_keeps_its_closed_turn(key, judged):
    judged.store([make_record(key, [user("hi")], session_id="s-back", session_done=True)])
    again = make_record(key, [user("me again")], session_id="s-back")
    assert judged.store([again]) == []
    session = Session.objects.get(external_id="s-back")
    assert session.closed_at is None and session.turn_count == 2
    assert (
        Turn.objects.filter(session=session, closed_without_next=True, next_state__isnull=True).count() == 1
    )


def test_side_turns_are_detected_and_never_take_or_give_a_next_state(key, judged):
    main = make_record(key, [system(), user("plan my day")], reply="Here is a plan.")
    history = [system(), user("plan my day"), assistant("Here is a plan.")]
    heartbeat = make_record(
        key, [*history, user("Read HEARTBEAT.md if it exists. Reply HEARTBEAT_OK.")], reply="HEARTBEAT_OK"
    )
    flush = make_record(
        key, [user("Pre-compaction memory flush. Store durable memories now.")], reply="NO_REPLY"
    )
    explicit_side = make_record(key, [*history, user("title this chat")], turn_type="side", reply="Day plan")
    follow_up = make_record(
        key, [*history, user("Read HEARTBEAT.md"), assistant("HEARTBEAT_OK"), user("move lunch to 1pm")]
    )
    ready = judged.store([main, heartbeat, flush, explicit_side, follow_up])

    types = {t.request_id: t.turn_type for t in Turn.objects.all()}
    assert types == {
        main.request_id: "main",
        heartbeat.request_id: "side",
        flush.request_id: "side",
        explicit_side.request_id: "side",
        follow_up.request_id: "main",
    }
    # The heartbeat continued the main conversation, and the follow-up continued the heartbeat: one session.
    assert turn(heartbeat.request_id).session_id == turn(main.request_id).session_id
    assert turn(follow_up.request_id).session_id == turn(main.request_id).session_id
    assert turn(main.request_id).next_state == [user("move lunch to 1pm")]
    assert turn(heartbeat.request_id).next_state is None
    assert ready == [turn(main.request_id).pk]


def test_configured_side_pattern(key, settings):
    settings.CONVERSATION_SIDE_PATTERNS = [r"^\[cron:"]
    record = make_record(key, [user("[cron:nightly] summarise the inbox")])
    capture_store([record])
    assert turn(record.request_id).turn_type == "side"


def test_failed_turns_are_stored_but_never_wait_for_a_next_state(key):
    first = make_record(key, [user("hi")], reply="hello", session_id="s-f")
    failed = make_record(
        key,
        [user("hi"), assistant("hello"), user("go on")],
        session_id="s-f",
        status="failed",
        error="upstream refused",
    )
    retry = make_record(key, [user("hi"), assistant("hello"), user("go on")], session_id="s-f")
    capture_store([first, failed])
    assert turn(first.request_id).next_state == [user("go on")]
    capture_store([retry])
    stored = turn(failed.request_id)
    assert stored.status == "failed" and stored.error == "upstream refused" and stored.response == []
    assert stored.next_state is None and not stored.closed_without_next


def test_group_members_with_the_same_session_id_get_separate_sessions(db):
    group = make_group()
    alice, bob = add_member(group, role=Role.MEMBER), add_member(group, role=Role.MEMBER)
    key_a, key_b = make_key(alice, group=group)[0], make_key(bob, group=group)[0]
    a = make_record(key_a, [user("alice here")], session_id="shared")
    b = make_record(key_b, [user("bob here")], session_id="shared")
    capture_store([a, b])
    sa, sb = turn(a.request_id).session, turn(b.request_id).session
    assert sa != sb and sa.user == alice and sb.user == bob
    assert sa.tenant == sb.tenant == group.tenant
    assert turn(a.request_id).next_state is None  # bob's message is not alice's next state


def test_other_users_messages_never_continue_a_session(db):
    key_a, key_b = make_key()[0], make_key()[0]
    first = make_record(key_a, [user("hi")], reply="hello")
    copy = make_record(key_b, [user("hi"), assistant("hello"), user("hijack")])
    capture_store([first, copy])
    assert turn(first.request_id).session_id != turn(copy.request_id).session_id
    assert turn(first.request_id).next_state is None


def test_a_bad_record_does_not_lose_the_rest_of_the_batch_and_is_named_not_skipped(key, caplog):
    good1 = make_record(key, [user("one")])
    bad = make_record(key, [user("two")], model="m" * 500)  # longer than the column: the database refuses it
    nul = make_record(key, [user("three\u0000")])  # PostgreSQL's jsonb refuses NUL characters
    good2 = make_record(key, [user("four")])
    failed = store.STATS["failed"]
    with caplog.at_level(logging.ERROR, logger="clawhub.conversations.capture"):
        with pytest.raises(store.CaptureFailed) as raised:
            capture_store([good1, bad, nul, good2])
    # The caller (the consumer) gets the failing records back, to retry and then dead-letter them.
    assert [r.request_id for r, _ in raised.value.failures] == [bad.request_id, nul.request_id]
    assert set(Turn.objects.values_list("request_id", flat=True)) == {good1.request_id, good2.request_id}
    assert store.STATS["failed"] == failed + 2
    assert bad.request_id in caplog.text and nul.request_id in caplog.text
    # Only the stored records are metered here: a failing one is metered once, when it is dead-lettered.
    row = UsageDaily.objects.get(key=key, model=key.owner.tenant.model_id)
    assert row.requests == 2
    store.capture_usage_only(record=nul)
    row.refresh_from_db()
    assert row.requests == 3
    assert row.prompt_tokens == good1.prompt_tokens + nul.prompt_tokens + good2.prompt_tokens


def test_a_batch_delivered_twice_is_stored_once(key):
    records = [make_record(key, [user("a")]), make_record(key, [user("b")])]
    capture_store(records)
    capture_store([*records, records[0]])
    assert Turn.objects.count() == 2
    assert UsageDaily.objects.get().requests == 2


def test_queries_per_batch_do_not_grow_with_the_batch(key, django_assert_max_num_queries):
    def batch(n, prefix):
        records = []
        for i in range(n):
            records.append(make_record(key, [user(f"{prefix} {i}")], reply=f"r{i}"))
            records.append(make_record(key, [user(f"{prefix} {i}"), assistant(f"r{i}"), user("more")]))
            records.append(make_record(key, [user("x")], session_id=f"{prefix}-{i}", session_done=i % 2 == 0))
        return records

    capture_store(batch(2, "warm"))
    # 18: linking by continuation locks the batch's users (one statement), reads the families of the turns
    # it links, and judging skips cut turns.
    with django_assert_max_num_queries(18) as small:
        capture_store(batch(3, "small"))
    with django_assert_max_num_queries(18) as large:
        capture_store(batch(60, "large"))
    assert len(large.captured_queries) == len(small.captured_queries)
    assert Turn.objects.count() == 3 * (2 + 3 + 60)


def test_a_user_who_turned_storage_off_is_metered_but_not_stored(key):
    key.owner.store_turns = False
    key.owner.save(update_fields=["store_turns"])
    other = make_key()[0]
    capture_store([make_record(key, [user("private")]), make_record(other, [user("fine")])])
    assert list(Turn.objects.values_list("user_id", flat=True)) == [other.owner_id]
    assert not Session.objects.filter(user=key.owner).exists()
    assert UsageDaily.objects.get(key=key).requests == 1
