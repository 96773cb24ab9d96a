"""O(n) storage per session: each turn stores what it adds to its parent's prompt (messages and vLLM's prompt
token ids), and the selectors rebuild every prompt exactly as it was sent."""

import httpx
import orjson
import pytest

from clawhub.conversations.capture.compact import forget_recent_prompts
from clawhub.conversations.capture.records import RawIds
from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from clawhub.conversations.privacy import _detach_from
from clawhub.conversations.selectors import turn_prompt_token_ids, turn_request, turns_messages
from tests.conversations.conftest import assistant, make_record, system, user
from tests.factories import make_key, make_user
from tests.gateway.conftest import fake, fake_upstream, gateway, gateway_factory  # noqa: F401

TURNS = 100


def _stored_messages(turns) -> int:
    return sum(len(orjson.loads(t.messages_added)) for t in turns)


def test_a_100_turn_session_through_the_gateway_stores_linearly_and_rebuilds_exactly(gateway):  # noqa: F811
    owner = make_user()
    _, secret = make_key(owner)
    sent: list[list[dict]] = []
    history = [
        {"role": "system", "content": "You are a careful agent. " * 40},
        {"role": "user", "content": "step 0", "name": "me"},
    ]
    with httpx.Client(base_url=gateway.v1, headers={"Authorization": f"Bearer {secret}"}, timeout=30) as http:
        for i in range(TURNS):
            body = {
                "model": "clawhub-personal",
                "messages": history,
                "stream": i % 2 == 1,
                "temperature": 0.5,
            }
            sent.append(orjson.loads(orjson.dumps(history)))
            response = http.post("/chat/completions", json=body)
            assert response.status_code == 200
            if body["stream"]:
                text = "".join(
                    (orjson.loads(line[6:])["choices"] or [{}])[0].get("delta", {}).get("content") or ""
                    for line in response.text.splitlines()
                    if line.startswith("data: {") and orjson.loads(line[6:]).get("choices")
                )
            else:
                text = response.json()["choices"][0]["message"]["content"]
            # Resent the way clients do: key order and fields of their own.
            history = [
                *history,
                {"content": text, "role": "assistant"},
                {"role": "user", "content": f"step {i + 1}"},
            ]
    records = gateway.spy.wait_for(TURNS, timeout=60)
    assert len({r.request_id for r in records}) == TURNS
    # Several writer batches, and the writer's memory of recent prompts forgotten in between, so that bases
    # are rebuilt from the database too.
    for start in range(0, TURNS, 25):
        forget_recent_prompts()
        capture_store(sorted(records, key=lambda r: r.started_at)[start : start + 25])

    turns = list(Turn.objects.filter(user=owner).order_by("created_at"))
    assert len(turns) == TURNS and len({t.session_id for t in turns}) == 1
    # Whole prompts would be sum(2i + 2) = 10,100 messages. Stored: the first turn's 2, then each turn's
    # resent reply and new user message.
    assert _stored_messages(turns) == 2 + 2 * (TURNS - 1) == 200
    assert all(t.messages_shared == 2 * i for i, t in enumerate(turns))
    rebuilt = turns_messages(turns=turns)
    for i, t in enumerate(turns):
        assert orjson.dumps(rebuilt[t.pk]) == orjson.dumps(sent[i]), f"turn {i}"
    # vLLM's prompt ids too: each turn stores only what follows its parent's ids.
    by_request = {r.request_id: r for r in records}
    for t in turns:
        assert turn_prompt_token_ids(turn=t) == by_request[t.request_id].prompt_token_ids
    stored_ids = sum(len(bytes(t.prompt_token_ids_added or b"")) // 4 for t in turns)
    whole_ids = sum(len(by_request[t.request_id].prompt_token_ids) for t in turns)
    assert stored_ids < whole_ids / 20
    # Every turn linked to the one before.
    assert [t.parent_id for t in turns[1:]] == [t.pk for t in turns[:-1]]
    assert turn_request(turn=turns[-1])["temperature"] == 0.5


@pytest.mark.django_db
def test_prompt_ids_sent_as_text_are_parsed_only_past_the_text_of_their_base(key, monkeypatch):
    """An agent resends its whole conversation: when the gateway handed the prompt ids over as vLLM's text
    (RawIds) and it starts with the base prompt's text, capture parses only the ids after it, and stores the
    same rows as when it parses them all."""
    parsed = []
    packed = RawIds.packed
    monkeypatch.setattr(RawIds, "packed", lambda self: parsed.append(len(self.raw)) or packed(self))

    def text(ids):
        return RawIds(orjson.dumps(ids))

    history = list(range(1000, 4000))  # an agent's 3,000-id system prompt and tools
    one = [system(), user("one")]
    two = [*one, assistant("1"), user("two")]
    three = [*two, assistant("2"), user("three")]
    records = [
        make_record(key, one, reply="1", prompt_token_ids=text([*history, 5]), token_ids=[91, 92]),
        # The reply's ids come back partly re-rendered (92 -> 93), as a chat template may.
        make_record(key, two, reply="2", prompt_token_ids=text([*history, 5, 91, 93, 6]), token_ids=[81]),
        make_record(key, three, reply="3", prompt_token_ids=text([*history, 5, 91, 93, 6, 81, 7, 8]),
                    token_ids=[71]),
    ]
    forget_recent_prompts()
    capture_store(records[:1])
    capture_store(records[1:])  # the second's base from this process's memory, the third's from its batch
    turns = [Turn.objects.get(request_id=r.request_id) for r in records]
    assert [turn_prompt_token_ids(turn=t) for t in turns] == [list(r.prompt_token_ids) for r in records]
    assert [(t.prompt_token_ids_shared, t.prompt_token_count) for t in turns] == [(0, 3001), (3002, 3004),
                                                                                  (3005, 3007)]
    assert [len(bytes(t.prompt_token_ids_added)) // 4 for t in turns] == [3001, 2, 2]
    # The first prompt whole; after it, only what follows each base prompt's text: "[91,93,6]", "[81,7,8]".
    assert parsed[0] == len(records[0].prompt_token_ids.raw) and sorted(parsed[1:3]) == [8, 9]
    # The memory of recent prompts forgotten (bases rebuilt from the database) or text that does not extend
    # the base's ("[1000,2" is no prefix of "[1000,23"): every id parsed, the same rows.
    forget_recent_prompts()
    four = [*three, assistant("3"), user("four")]
    again = make_record(key, four, reply="4", token_ids=[61],
                        prompt_token_ids=text([*history, 5, 91, 93, 6, 81, 7, 8, 71, 9]))
    capture_store([again])
    stored = Turn.objects.get(request_id=again.request_id)
    assert (stored.prompt_token_ids_shared, stored.prompt_token_count) == (3008, 3009)
    assert turn_prompt_token_ids(turn=stored) == list(again.prompt_token_ids)
    short = make_record(key, [user("a")], reply="b", prompt_token_ids=text([1000, 2]), token_ids=[3])
    capture_store([short])
    longer = make_record(key, [user("a"), assistant("b"), user("c")], reply="d",
                         prompt_token_ids=text([1000, 23, 3]), token_ids=[4])
    capture_store([longer])
    stored = Turn.objects.get(request_id=longer.request_id)
    assert stored.prompt_token_ids_shared == 1 and turn_prompt_token_ids(turn=stored) == [1000, 23, 3]
    # Text past the base's that is not ids: the turn is stored without served prompt ids.
    bad = make_record(key, [*four, assistant("4"), user("five")], reply="5",
                      prompt_token_ids=RawIds(again.prompt_token_ids.raw[:-1] + b",61,-1]"), token_ids=[1])
    capture_store([bad])
    stored = Turn.objects.get(request_id=bad.request_id)
    assert stored.prompt_token_count is None and turn_prompt_token_ids(turn=stored) is None


@pytest.mark.django_db
def test_a_turn_whose_base_is_purged_is_rewritten_whole(key):
    first = make_record(key, [system(), user("one")], reply="1", prompt_token_ids=[1, 2, 3], token_ids=[9])
    second = make_record(
        key,
        [system(), user("one"), assistant("1"), user("two")],
        reply="2",
        prompt_token_ids=[1, 2, 3, 9, 4],
        token_ids=[8],
    )
    capture_store([first, second])
    base, child = (
        Turn.objects.get(request_id=first.request_id),
        Turn.objects.get(request_id=second.request_id),
    )
    assert (
        child.prompt_base_id == base.pk and child.messages_shared == 2 and child.prompt_token_ids_shared == 4
    )
    _detach_from([base.pk])
    base.delete()
    child.refresh_from_db()
    assert child.prompt_base_id is None and child.messages_shared == 0
    assert turn_request(turn=child)["messages"] == second.request["messages"]
    assert turn_prompt_token_ids(turn=child) == [1, 2, 3, 9, 4]


@pytest.mark.django_db
def test_rows_written_before_the_split_storage_still_read(key):
    record = make_record(key, [user("old")], reply="row")
    capture_store([record])
    legacy = Turn.objects.get(request_id=record.request_id)
    Turn.objects.filter(pk=legacy.pk).update(
        request={"messages": [user("old")], "temperature": 0.6}, messages_added=""
    )
    legacy.refresh_from_db()
    assert turn_request(turn=legacy) == {"messages": [user("old")], "temperature": 0.6}


@pytest.mark.django_db
def test_the_migration_moves_existing_messages_out_and_links_by_continuation(key):
    import importlib

    from django.apps import apps

    migration = importlib.import_module("clawhub.conversations.migrations.0003_turn_messages_apart")
    records = [
        make_record(key, [system(), user("one")], reply="1", session_id="old"),
        make_record(key, [system(), user("one"), assistant("1"), user("two")], reply="2", session_id="old"),
        make_record(
            key,
            [system(), user("one"), assistant("1"), user("two"), assistant("2"), user("three")],
            session_id="old",
        ),
    ]
    capture_store(records)
    # Back to the shape rows had before: whole messages in request, nothing else.
    for r in records:
        Turn.objects.filter(request_id=r.request_id).update(
            request={**r.request},
            messages_added="",
            messages_shared=0,
            prompt_base=None,
            parent=None,
            link="",
            prompt_hash="",
            parent_hash="",
            follows=None,
            ended="",
        )
    migration.forwards(apps, None)
    turns = [Turn.objects.get(request_id=r.request_id) for r in records]
    assert [t.messages_shared for t in turns] == [0, 2, 4]
    assert [len(orjson.loads(t.messages_added)) for t in turns] == [2, 2, 2]
    assert [t.parent_id for t in turns] == [None, turns[0].pk, turns[1].pk]
    assert all("messages" not in t.request and t.ended == "stop" for t in turns)
    rebuilt = turns_messages(turns=turns)
    assert [rebuilt[t.pk] for t in turns] == [r.request["messages"] for r in records]


def test_split_ids_shares_the_longest_common_prefix_with_a_base_given_packed_or_not():
    import random

    from clawhub.conversations.storage import common_id_prefix, pack_ids, split_ids

    rng = random.Random(7)
    for _ in range(500):
        ids = [rng.choice([0, 1, 255, 256, 65536, 2**32 - 1]) for _ in range(rng.randint(0, 40))]
        base = ids[: rng.randint(0, len(ids))] + [rng.randint(0, 3) for _ in range(rng.randint(0, 4))]
        shared = common_id_prefix(ids, base) if base else 0
        assert split_ids(ids, base) == split_ids(ids, pack_ids(base)) == (shared, pack_ids(ids[shared:]))
    # Ids that agree in some of their bytes but not all are not shared.
    assert split_ids([1, 2, 0x01000003], [1, 2, 3, 9])[0] == 2
