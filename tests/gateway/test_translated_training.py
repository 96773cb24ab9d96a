"""A turn that came through /v1/messages (Claude Code's API) or /v1/responses (Codex's) goes the whole way a
chat turn goes: captured and linked, judged from the user's next message, and given to the trainer as the
served token ids and log-probs, driven over HTTP by each API's official SDK in front of the fake upstream."""

import anthropic
import openai
import pytest

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from clawhub.conversations.selectors import SERVED_IDS
from clawhub.review.models import Sample
from tests.factories import make_key, make_user
from tests.gateway.conftest import activate_adapter
from workers.tasks.judging import judge_turn
from workers.tasks.training import train_sample

ASKED = "Write one sentence about tea."
CORRECTION = "That's wrong: I said plain text, no bold. Try again."


def _messages_session(gateway, secret: str) -> None:
    client = anthropic.Anthropic(base_url=gateway.url, api_key=secret, max_retries=0)
    history = [{"role": "user", "content": ASKED}]
    first = client.messages.create(model="clawhub-personal", max_tokens=8, messages=history,
                                   extra_headers={"X-Claude-Code-Session-Id": "cc-train"})
    history += [{"role": "assistant", "content": first.content[0].text},
                {"role": "user", "content": CORRECTION}]
    client.messages.create(model="clawhub-personal", max_tokens=8, messages=history,
                           extra_headers={"X-Claude-Code-Session-Id": "cc-train"})


def _responses_session(gateway, secret: str) -> None:
    client = openai.OpenAI(base_url=gateway.v1, api_key=secret, max_retries=0)
    history: list = [{"role": "user", "content": ASKED}]
    first = client.responses.create(model="clawhub-personal", input=history, store=False, max_output_tokens=8,
                                    extra_headers={"session_id": "codex-train"})
    history += [item.model_dump(exclude_none=True) for item in first.output]
    history.append({"role": "user", "content": CORRECTION})
    client.responses.create(model="clawhub-personal", input=history, store=False, max_output_tokens=8,
                            extra_headers={"session_id": "codex-train"})


@pytest.mark.parametrize("api, session", [("messages", _messages_session), ("responses", _responses_session)])
def test_a_translated_turn_is_judged_and_trained_on_its_served_tokens(gateway, fake, settings, api, session):
    settings.CLAWHUB_JUDGE = "rule"
    user = make_user()
    _, secret = make_key(user)
    activate_adapter(user.tenant)
    session(gateway, secret)
    records = gateway.spy.wait_for(2)
    capture_store(records)

    first, second = Turn.objects.filter(user=user).order_by("created_at")
    assert (first.api, second.api) == (api, api) and second.parent_id == first.pk
    assert first.next_state == [{"role": "user", "content": CORRECTION}]
    judge_turn.apply(args=[first.pk])

    sample = Sample.objects.get(turn=first)
    assert sample.reward == -1 and sample.judgment.hints  # the correction is the hint
    trained = train_sample(sample)
    assert trained.source.startswith(SERVED_IDS)  # not a re-rendered chat template
    assert trained.response_token_ids == records[0].token_ids and trained.response_logprobs
    assert trained.prompt_token_ids == records[0].prompt_token_ids
    assert trained.reward == -1 and trained.hints == sample.judgment.hints
