"""Turns as the gateway would capture them, for judging tests."""

import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from clawhub.keys.models import ApiKey
from tests.conversations.conftest import assistant, make_record, user
from tests.factories import make_key

QUESTION = "List three fruits."
REPLY = "**Apple**, **pear**, **plum**."


def capture_exchange(key: ApiKey, follow_up: str | None, *, session_id: str | None = None,
                     **fields) -> list[Turn]:
    """A main turn answered with REPLY, then (if given) the user's follow-up as the next request, which
    links the first turn's next state. Returns the turns in order."""
    first = [user(QUESTION)]
    records = [make_record(key, first, reply=REPLY, session_id=session_id, **fields)]
    if follow_up is not None:
        records.append(make_record(key, [*first, assistant(REPLY), user(follow_up)],
                                   reply="Apple, pear, plum.", session_id=session_id, **fields))
    capture_store(records)
    return list(Turn.objects.filter(request_id__in=[r.request_id for r in records]).order_by("created_at"))


@pytest.fixture
def key(db) -> ApiKey:
    return make_key()[0]


@pytest.fixture
def judged_turn(key) -> Turn:
    """A main turn whose next state is a correction."""
    turn = capture_exchange(key, "That's wrong, I said no bold text.")[0]
    assert turn.next_state is not None
    return turn
