"""Next-state linking by continuation: for each scenario, the exact (turn -> next state) pairs and links.

A main turn's next state is what the request that continues its prompt + reply added after the reply; a
request repeating a turn's prompt is a regenerate (a sibling, never a next state); one continuing an earlier
turn after another already did is a fork. Order is the requests' start time, whatever order writers commit.
"""

import threading

import pytest
from django.db import connection

from clawhub.conversations import hooks
from clawhub.conversations.capture import graph
from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import ConversationSettings, Session, Turn
from clawhub.conversations.services import session_close_idle
from tests.conversations.conftest import assistant, make_record, system, tool, tool_call, topic_session, user

pytestmark = pytest.mark.django_db


def turn(record) -> Turn:
    return Turn.objects.get(request_id=record.request_id)


def pairs(*records) -> dict[str, list | None]:
    """request id -> next state, for the given records' turns."""
    return {r.request_id: turn(r).next_state for r in records}


def links(*records) -> dict[str, tuple[str, str | None]]:
    """request id -> (link, request id of the turn linked to: the parent, or the regenerated sibling)."""
    out = {}
    for r in records:
        t = turn(r)
        other = t.regenerate_of if t.link == Turn.Link.REGENERATE else t.parent
        out[r.request_id] = (t.link, other.request_id if other else None)
    return out


@pytest.fixture
def judged(monkeypatch, django_capture_on_commit_callbacks):
    calls: list[int] = []
    monkeypatch.setattr(hooks, "on_turn_ready_for_judging", lambda ids: calls.extend(ids))

    def store(records):
        with django_capture_on_commit_callbacks(execute=True):
            capture_store(records)
        return calls

    return store


@pytest.mark.parametrize("same_batch", [True, False])
def test_a_regenerate_is_a_sibling_never_the_next_state(key, same_batch):
    a = make_record(key, [system(), user("name a colour")], reply="Blue.")
    regen = make_record(key, [system(), user("name a colour")], reply="Red.")  # the user hit "regenerate"
    c = make_record(
        key, [system(), user("name a colour"), assistant("Red."), user("a warmer one?")], reply="Orange."
    )
    for batch in ([a, regen, c],) if same_batch else ([a], [regen], [c]):
        capture_store(batch)
    # Before: regen was recorded as a's next state (a's own question). Now a waits, regen owns the follow-up.
    assert pairs(a, regen, c) == {
        a.request_id: None,
        regen.request_id: [user("a warmer one?")],
        c.request_id: None,
    }
    assert links(a, regen, c) == {
        a.request_id: ("", None),
        regen.request_id: ("regenerate", a.request_id),
        c.request_id: ("next", regen.request_id),
    }
    assert len({turn(r).session_id for r in (a, regen, c)}) == 1


def test_a_regenerate_later_in_the_conversation_keeps_the_first_continuation(key):
    t1 = make_record(key, [user("plan a trip")], reply="Where to?")
    history = [user("plan a trip"), assistant("Where to?"), user("Lisbon")]
    t2 = make_record(key, history, reply="Day 1: Alfama.")
    t2_again = make_record(key, history, reply="Day 1: Belém.")
    t3 = make_record(key, [*history, assistant("Day 1: Belém."), user("and day 2?")])
    capture_store([t1, t2, t2_again, t3])
    assert pairs(t1, t2, t2_again, t3) == {
        t1.request_id: [user("Lisbon")],
        t2.request_id: None,
        t2_again.request_id: [user("and day 2?")],
        t3.request_id: None,
    }
    assert links(t2, t2_again, t3) == {
        t2.request_id: ("next", t1.request_id),
        t2_again.request_id: ("regenerate", t2.request_id),
        t3.request_id: ("next", t2_again.request_id),
    }


def test_a_fork_links_to_its_own_parent(key):
    t1 = make_record(key, [user("write a title")], reply="Dawn")
    t2 = make_record(key, [user("write a title"), assistant("Dawn"), user("longer")], reply="Dawn Over Water")
    t3 = make_record(
        key,
        [
            user("write a title"),
            assistant("Dawn"),
            user("longer"),
            assistant("Dawn Over Water"),
            user("perfect"),
        ],
    )
    # The user edits their second message and goes on from there: a branch off t1.
    fork = make_record(key, [user("write a title"), assistant("Dawn"), user("in French")], reply="Aube")
    after_fork = make_record(
        key, [user("write a title"), assistant("Dawn"), user("in French"), assistant("Aube"), user("merci")]
    )
    capture_store([t1, t2])
    capture_store([t3, fork])
    capture_store([after_fork])
    assert pairs(t1, t2, t3, fork, after_fork) == {
        t1.request_id: [user("longer")],
        t2.request_id: [user("perfect")],
        t3.request_id: None,
        fork.request_id: [user("merci")],
        after_fork.request_id: None,
    }
    assert links(t2, t3, fork, after_fork) == {
        t2.request_id: ("next", t1.request_id),
        t3.request_id: ("next", t2.request_id),
        fork.request_id: ("fork", t1.request_id),
        after_fork.request_id: ("next", fork.request_id),
    }
    assert len({turn(r).session_id for r in (t1, t2, t3, fork, after_fork)}) == 1


@pytest.mark.parametrize("headers", [False, True])
def test_two_interleaved_sessions_of_one_user(key, headers):
    sid = {"A": "sess-A", "B": "sess-B"} if headers else {"A": None, "B": None}
    a, b = topic_session("A"), topic_session("B")
    a1 = make_record(key, a[0], reply="about A", session_id=sid["A"])
    b1 = make_record(key, b[0], reply="about B", session_id=sid["B"])
    a2 = make_record(key, a[1], reply="more about A", session_id=sid["A"])
    b2 = make_record(key, b[1], reply="more about B", session_id=sid["B"])
    a3 = make_record(key, a[2], session_id=sid["A"])
    b3 = make_record(key, b[2], session_id=sid["B"])
    capture_store([a1, b1, a2])
    capture_store([b2, a3, b3])
    assert pairs(a1, a2, a3, b1, b2, b3) == {
        a1.request_id: [user("more A")],
        a2.request_id: [user("done with A")],
        a3.request_id: None,
        b1.request_id: [user("more B")],
        b2.request_id: [user("done with B")],
        b3.request_id: None,
    }
    assert links(a2, a3, b2, b3) == {
        a2.request_id: ("next", a1.request_id),
        a3.request_id: ("next", a2.request_id),
        b2.request_id: ("next", b1.request_id),
        b3.request_id: ("next", b2.request_id),
    }
    sessions = {r.request_id: turn(r).session for r in (a1, a2, a3, b1, b2, b3)}
    assert len({sessions[r.request_id].pk for r in (a1, a2, a3)}) == 1
    assert len({sessions[r.request_id].pk for r in (b1, b2, b3)}) == 1
    assert sessions[a1.request_id] != sessions[b1.request_id]
    if headers:
        assert sessions[a1.request_id].external_id == "sess-A" and not sessions[a1.request_id].inferred


def test_inside_a_named_session_linking_follows_the_messages(key):
    """One X-Session-Id for two conversations (an agent that reuses its id): each turn still gets the reply
    to its own messages, not the session's newest waiting turn."""
    a, b = topic_session("A"), topic_session("B")
    a1 = make_record(key, a[0], reply="about A", session_id="shared")
    b1 = make_record(key, b[0], reply="about B", session_id="shared")
    a2 = make_record(key, a[1], session_id="shared")
    capture_store([a1, b1, a2])
    # Before: b1 (the session's newest waiting turn) took "more A".
    assert pairs(a1, b1) == {a1.request_id: [user("more A")], b1.request_id: None}


@pytest.mark.parametrize(
    "workers",
    [
        "sequential",
        # Real concurrent transactions need committed rows to see each other.
        pytest.param("threads", marks=pytest.mark.django_db(transaction=True)),
    ],
)
def test_out_of_order_commits_from_two_gateway_workers(key, workers, judged):
    """Worker 1 serves turns 1 and 3, worker 2 turn 2; worker 2's writer commits last. Turn 3 is written
    before its parent turn 2: when turn 2 arrives it adopts turn 3 (and its session)."""
    t1 = make_record(key, [user("step 1")], reply="r1")
    t2 = make_record(key, [user("step 1"), assistant("r1"), user("step 2")], reply="r2")
    t3 = make_record(
        key, [user("step 1"), assistant("r1"), user("step 2"), assistant("r2"), user("step 3")], reply="r3"
    )
    t4 = make_record(
        key,
        [
            user("step 1"),
            assistant("r1"),
            user("step 2"),
            assistant("r2"),
            user("step 3"),
            assistant("r3"),
            user("step 4"),
        ],
    )
    if workers == "sequential":
        judged([t1, t3])
        judged([t4])
        ready = judged([t2])
    else:
        # Two writers at once, as two gateway processes would: each in its own connection and transaction.
        judged([t1])
        errors = []

        def write(batch):
            try:
                capture_store(batch)
            except Exception as exc:  # pragma: no cover - shown by the assertion below
                errors.append(exc)
            finally:
                connection.close()

        threads = [
            threading.Thread(target=write, args=([t3, t4],)),
            threading.Thread(target=write, args=([t2],)),
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        assert not errors
        ready = [turn(t1).pk, turn(t2).pk, turn(t3).pk]
    assert pairs(t1, t2, t3, t4) == {
        t1.request_id: [user("step 2")],
        t2.request_id: [user("step 3")],
        t3.request_id: [user("step 4")],
        t4.request_id: None,
    }
    assert links(t2, t3, t4) == {
        t2.request_id: ("next", t1.request_id),
        t3.request_id: ("next", t2.request_id),
        t4.request_id: ("next", t3.request_id),
    }
    assert len({turn(r).session_id for r in (t1, t2, t3, t4)}) == 1
    assert Session.objects.filter(user=key.owner).count() == 1
    assert sorted(set(ready)) == sorted([turn(t1).pk, turn(t2).pk, turn(t3).pk])


def test_tool_calls_with_parallel_results(key):
    calls = [tool_call("read", '{"path": "a"}', "c1"), tool_call("read", '{"path": "b"}', "c2")]
    asking = make_record(key, [system(), user("compare a and b")], reply=None, tool_calls=calls)
    results = [tool("contents of a", "c1"), tool("ERROR: b not found", "c2")]
    answering = make_record(
        key, [system(), user("compare a and b"), assistant(None, calls), *results], reply="b is missing"
    )
    closing = make_record(
        key,
        [
            system(),
            user("compare a and b"),
            assistant(None, calls),
            *results,
            assistant("b is missing"),
            user("create b then"),
        ],
    )
    capture_store([asking, answering, closing])
    assert pairs(asking, answering, closing) == {
        asking.request_id: results,
        answering.request_id: [user("create b then")],
        closing.request_id: None,
    }
    assert turn(asking).ended == "tool_calls" and turn(answering).ended == "stop"


def test_a_session_closed_by_x_session_done(key, judged):
    t1 = make_record(key, [user("hi")], reply="hello", session_id="s-done")
    t2 = make_record(
        key,
        [user("hi"), assistant("hello"), user("bye")],
        reply="bye!",
        session_id="s-done",
        session_done=True,
    )
    ready = judged([t1, t2])
    assert pairs(t1, t2) == {t1.request_id: [user("bye")], t2.request_id: None}
    assert turn(t2).closed_without_next and Session.objects.get(external_id="s-done").close_reason == "done"
    assert sorted(ready) == sorted([turn(t1).pk, turn(t2).pk])


def test_a_session_closed_by_idle_timeout_closes_every_waiting_turn(key, judged):
    t1 = make_record(key, [user("name a colour")], reply="Blue.")
    regen = make_record(key, [user("name a colour")], reply="Red.")
    judged([t1, regen])
    Session.objects.update(last_activity_at=Session.objects.get().last_activity_at.replace(year=2000))
    assert session_close_idle() == 1
    assert pairs(t1, regen) == {t1.request_id: None, regen.request_id: None}
    assert turn(t1).closed_without_next and turn(regen).closed_without_next


# --- OpenClaw ---------------------------------------------------------------------------------------------

RUNTIME = (
    "Runtime: agent=main | session=agent:main:main | sessionId=4f1c2a7e-0000-4000-8000-000000000001 | "
    "host=box | repo=/home/u/work | os=linux | node=24.22.3 | model=clawhub/clawhub-personal"
)
INTERNAL = [
    {
        "type": "text",
        "text": "<<<BEGIN_OPENCLAW_INTERNAL_CONTEXT>>>\nworkspace: AGENTS.md, SOUL.md\n"
        "<<<END_OPENCLAW_INTERNAL_CONTEXT>>>",
    }
]


def test_openclaw_shaped_turns(key):
    """Timestamps in front of user messages (re-rendered on resend), the Runtime line, internal context as a
    content array, and a retry that keeps the failed user message in the history."""
    sys = system("You are OpenClaw. " * 200)
    first_user = user(f"[Tue 2026-12-01 08:27 UTC] list the repo\n\n{RUNTIME}")
    t1 = make_record(key, [sys, first_user], reply="README.md, src/")
    # OpenClaw resends the history; here its clock renders the first message's stamp with seconds.
    resent_first = user(f"[Tue 2026-12-01 08:27:03 UTC] list the repo\n\n{RUNTIME}")
    history = [
        sys,
        resent_first,
        assistant("README.md, src/"),
        {"role": "user", "content": INTERNAL},
        user("[Tue 2026-12-01 08:29 UTC] open src"),
    ]
    failed = make_record(key, history, status="failed", error="upstream 502")
    # The retry keeps the failed user message and sends it again.
    retry = make_record(key, [*history, user("[Tue 2026-12-01 08:29 UTC] open src")], reply="src/: main.py")
    t3 = make_record(
        key,
        [
            *history,
            user("[Tue 2026-12-01 08:29 UTC] open src"),
            assistant("src/: main.py"),
            user("[Tue 2026-12-01 08:31 UTC] thanks"),
        ],
    )
    capture_store([t1, failed])
    capture_store([retry, t3])
    # The next state is what the user said: no internal context, the retried message once.
    assert pairs(t1, retry) == {
        t1.request_id: [user("[Tue 2026-12-01 08:29 UTC] open src")],
        retry.request_id: [user("[Tue 2026-12-01 08:31 UTC] thanks")],
    }
    assert links(failed, retry, t3) == {
        failed.request_id: ("next", t1.request_id),
        retry.request_id: ("regenerate", failed.request_id),
        t3.request_id: ("next", retry.request_id),
    }
    assert len({turn(r).session_id for r in (t1, failed, retry, t3)}) == 1
    assert turn(failed).ended == "upstream_error"


def test_openclaw_drops_the_internal_context_when_it_resends_the_history(key):
    """As OpenClaw 2026.9.6 does: each request ends with an internal-context message, and the next request
    resends the history without it (prompt, reply, the user's new message, a new internal context)."""
    sys = system("You are OpenClaw. " * 200)
    first = user(f"[Tue 2026-12-01 08:27 UTC] say hi\n\n{RUNTIME}")
    internal = {"role": "user", "content": INTERNAL}
    t1 = make_record(key, [sys, first, internal], reply="hi")
    t2 = make_record(key, [sys, first, assistant("hi"), user("[Tue 2026-12-01 08:28 UTC] again"), internal],
                     reply="hi again")
    t3 = make_record(key, [sys, first, assistant("hi"), user("[Tue 2026-12-01 08:28 UTC] again"),
                           assistant("hi again"), user("[Tue 2026-12-01 08:29 UTC] thanks"), internal])
    capture_store([t1])
    capture_store([t2, t3])
    assert pairs(t1, t2) == {
        t1.request_id: [user("[Tue 2026-12-01 08:28 UTC] again")],
        t2.request_id: [user("[Tue 2026-12-01 08:29 UTC] thanks")],
    }
    assert links(t2, t3) == {t2.request_id: ("next", t1.request_id), t3.request_id: ("next", t2.request_id)}
    assert len({turn(r).session_id for r in (t1, t2, t3)}) == 1


def test_only_internal_context_after_a_reply_is_no_next_state(key):
    t1 = make_record(key, [user("hi")], reply="hello")
    t2 = make_record(key, [user("hi"), assistant("hello"), {"role": "user", "content": INTERNAL}])
    capture_store([t1, t2])
    assert turn(t1).next_state is None and turn(t1).closed_without_next


RETRY_INSTRUCTION = ("The previous attempt did not produce a user-visible answer. Continue from the current "
                     "state and produce the visible answer now. Do not restart from scratch.")


@pytest.mark.parametrize("first_turn", [False, True])
def test_openclaw_retries_a_served_reply_it_could_not_use(key, first_turn):
    """The model's reply was served whole (200, complete) but was a malformed tool call: OpenClaw drops it
    from its history and asks again with the same messages and an instruction to answer. That is a regenerate
    of the dropped turn, not a branch (as a retry after a failed request is): the parent's next state is
    still the user's message, and the turn after the retry continues the retry."""
    sys = system("You are OpenClaw. " * 200)
    internal = {"role": "user", "content": INTERNAL}
    opening = user(f"[Tue 2026-12-01 08:27 UTC] say hi\n\n{RUNTIME}")
    t1 = None if first_turn else make_record(key, [sys, opening, internal], reply="hi")
    asked = user(f"[Tue 2026-12-01 08:28 UTC] one sentence about tea\n\n{RUNTIME}" if first_turn
                 else "[Tue 2026-12-01 08:28 UTC] one sentence about tea")
    history = [sys, asked] if first_turn else [sys, opening, assistant("hi"), asked]
    dropped = make_record(key, [*history, internal], reply='<tool_call>\n{"name": "read", "arguments": {"pa')
    retry = make_record(key, [*history, internal, user(RETRY_INSTRUCTION)], reply="Tea is a calm drink.")
    # The retry's instruction stays in the history OpenClaw resends (as a retried message does after a
    # failed request), its internal context does not.
    after = make_record(key, [*history, user(RETRY_INSTRUCTION), assistant("Tea is a calm drink."),
                              user("[Tue 2026-12-01 08:30 UTC] thanks"), internal])
    capture_store([r for r in (t1, dropped) if r is not None])
    capture_store([retry, after])
    assert turn(dropped).status == Turn.Status.COMPLETE
    assert links(dropped, retry, after) == {
        dropped.request_id: ("", None) if first_turn else ("next", t1.request_id),
        retry.request_id: ("regenerate", dropped.request_id),
        after.request_id: ("next", retry.request_id),
    }
    assert turn(retry).next_state == [user("[Tue 2026-12-01 08:30 UTC] thanks")]
    if t1 is not None:
        assert turn(t1).next_state == [asked]
    assert len({turn(r).session_id for r in (t1, dropped, retry, after) if r is not None}) == 1


@pytest.mark.parametrize("sibling", ["failed", "served"])
@pytest.mark.parametrize("writes", ["one by one", "retry and next together", "next before the retry"])
def test_the_turn_after_a_served_retry_continues_it_without_the_instruction(key, judged, sibling, writes):
    """OpenClaw's retry (the user's message, then its instruction to answer) is served, and OpenClaw's next
    request resends the user's message and the retry's reply but not the instruction: that request still
    continues the retry (its second continuation hash, without the trailing retry messages), so the retry
    gets the user's next message as its next state. Seen in a shuffled run of the real CLI: turn 3 = message
    2 + the instruction, served; turn 4 = message 2, that reply, message 3, unlinked."""
    sys = system("You are OpenClaw. " * 200)
    internal = {"role": "user", "content": INTERNAL}
    first = user(f"[Wed 2026-12-02 09:00 UTC] say hi\n\n{RUNTIME}")
    second = user("[Wed 2026-12-02 09:01 UTC] one sentence about tea")
    third = user("[Wed 2026-12-02 09:02 UTC] and about coffee?")
    a = make_record(key, [sys, first, internal], reply="hi")
    history = [sys, first, assistant("hi"), second]
    b = (make_record(key, [*history, internal], status="failed", error="upstream 502") if sibling == "failed"
         else make_record(key, [*history, internal], reply='<tool_call>\n{"name": "read", "arguments": {"pa'))
    c = make_record(key, [*history, internal, user(RETRY_INSTRUCTION)], reply="Tea is a calm drink.")
    d = make_record(key, [*history, assistant("Tea is a calm drink."), third, internal], reply="Coffee, too.")
    batches = {
        "one by one": [[a], [b], [c], [d]],
        "retry and next together": [[a, b], [c, d]],
        "next before the retry": [[a, b], [d], [c]],  # a faster writer stored d: c adopts it
    }[writes]
    ready = []
    for batch in batches:
        ready = judged(batch)
    assert links(b, c, d) == {
        b.request_id: ("next", a.request_id),
        c.request_id: ("regenerate", b.request_id),
        d.request_id: ("next", c.request_id),
    }
    assert turn(c).next_state == [third]
    assert turn(c).pk in ready
    assert len({turn(r).session_id for r in (a, b, c, d)}) == 1

# --- cut turns --------------------------------------------------------------------------------------------


def _cut_records(key):
    def record(text, **fields):
        return make_record(key, [user(text)], reply="partial", **fields)

    length = record("long story please")
    length.choices[0]["finish_reason"] = "length"
    client = record("another", status="cut", http_status=499, error="client disconnected")
    upstream = record(
        "a third", status="cut", error="The model server stopped in the middle of the response."
    )
    whole = record("a fourth")
    follow = [
        make_record(key, [user(r.request["messages"][0]["content"]), assistant("partial"), user("go on")])
        for r in (length, client, upstream, whole)
    ]
    return (length, client, upstream, whole), follow


def test_cut_turns_are_linked_but_not_judged_by_default(key, judged):
    (length, client, upstream, whole), follow = _cut_records(key)
    ready = judged([length, client, upstream, whole, *follow])
    assert {r.request_id: turn(r).ended for r in (length, client, upstream, whole)} == {
        length.request_id: "length",
        client.request_id: "client_disconnect",
        upstream.request_id: "upstream_error",
        whole.request_id: "stop",
    }
    # Linked all the same (the page shows what followed), but only the whole reply goes to judging.
    assert all(turn(r).next_state == [user("go on")] for r in (length, client, upstream, whole))
    assert ready == [turn(whole).pk]


def test_the_tenant_setting_brings_length_turns_back(key, judged):
    ConversationSettings.objects.create(tenant=key.owner.tenant, include_length_turns=True)
    (length, client, upstream, whole), follow = _cut_records(key)
    ready = judged([length, client, upstream, whole, *follow])
    assert sorted(ready) == sorted([turn(length).pk, turn(whole).pk])


def test_a_batch_reads_a_few_stored_turns_however_long_the_history(key, monkeypatch):
    """A user who repeats a prompt leaves every turn a regenerate of the first, all waiting, all sharing one
    prompt and one continuation hash; a named session holds a long chain. The next batch still reads only a
    few stored turns (not every turn sharing a hash, not every waiting turn of the sessions it touches), and
    links exactly as it would reading them all."""
    first = make_record(key, [user("status?")], reply="All good.")
    capture_store([first])
    capture_store([make_record(key, [user("status?")], reply="All good.") for _ in range(30)])
    named = [make_record(key, [user(f"ping {i}")], session_id="named") for i in range(30)]
    capture_store(named)
    loaded = []
    from_db = Turn.from_db.__func__

    def counted(cls, *args, **kwargs):
        loaded.append(1)
        return from_db(cls, *args, **kwargs)

    made = graph.instance

    def counted_raw(model, names, values):  # capture's own raw reads on PostgreSQL
        if model is Turn:
            loaded.append(1)
        return made(model, names, values)

    monkeypatch.setattr(Turn, "from_db", classmethod(counted))
    monkeypatch.setattr(graph, "instance", counted_raw)
    again = make_record(key, [user("status?")], reply="All good.")
    answer = make_record(key, [user("pong")], session_id="named")
    capture_store([again, answer])
    assert len(loaded) <= 6, len(loaded)  # before: 94 (every turn sharing the prompt, all waiting ones)
    assert links(again, answer) == {
        again.request_id: ("regenerate", first.request_id),
        answer.request_id: ("next", named[-1].request_id),
    }
    assert turn(named[-1]).next_state == [user("pong")]


def _count_turns_read(monkeypatch) -> list:
    """Counts the stored turns capture reads back (its raw reads on PostgreSQL, querysets elsewhere)."""
    loaded = []
    from_db, made = Turn.from_db.__func__, graph.instance

    def counted(cls, *args, **kwargs):
        loaded.append(1)
        return from_db(cls, *args, **kwargs)

    def counted_raw(model, names, values):
        if model is Turn:
            loaded.append(1)
        return made(model, names, values)

    monkeypatch.setattr(Turn, "from_db", classmethod(counted))
    monkeypatch.setattr(graph, "instance", counted_raw)
    return loaded


@pytest.mark.skipif(connection.vendor != "postgresql", reason="the nearest prefixes are read on PostgreSQL")
def test_an_agent_turn_reads_its_parent_not_its_whole_conversation(key, monkeypatch):
    """Each request of an agent resends its conversation, so its prefixes match every earlier turn of it:
    only the newest prefix a stored main turn ends (the parent's) is read, with that turn's family."""
    messages = [system(), user("step 0")]
    records = []
    for n in range(12):
        record = make_record(key, list(messages), reply=f"done {n}")
        capture_store([record])
        records.append(record)
        messages += [assistant(f"done {n}"), user(f"step {n + 1}")]
    loaded = _count_turns_read(monkeypatch)
    last = make_record(key, list(messages))
    capture_store([last])
    assert len(loaded) <= 4, len(loaded)  # before: 24 (every earlier turn, and the children of each)
    assert links(last) == {last.request_id: ("next", records[-1].request_id)}
    assert turn(records[-1]).next_state == [user("step 12")]


def test_a_parent_older_than_the_newest_matching_prefix_is_still_found(key):
    """The newest prefix of a request in a named session is a turn of another session; an older one is a
    turn of its own: linking needs prefixes the nearest read left out, and reads them."""
    first_x = make_record(key, [user("a")], reply="A", session_id="x")
    capture_store([first_x])
    capture_store([make_record(key, [user("a"), assistant("A"), user("b")], reply="B", session_id="x")])
    first_y = make_record(key, [user("a")], reply="A", session_id="y")
    capture_store([first_y])
    later = make_record(key, [user("a"), assistant("A"), user("b"), assistant("B"), user("c")],
                        session_id="y")
    capture_store([later])
    assert links(later) == {later.request_id: ("next", first_y.request_id)}
    assert turn(later).session_id == turn(first_y).session_id
