"""/v1/feedback: an agent rates a completion by its id with the key that was served it."""

import httpx
import openai

from clawhub.conversations.models import Turn
from clawhub.feedback.models import ExplicitFeedback
from clawhub.keys.services import key_rotate
from tests.factories import make_key, make_user
from tests.gateway.conftest import wait_until

MSGS = [{"role": "user", "content": "hi there"}]


def test_a_key_rates_the_completions_it_was_served_and_nothing_else(gateway_factory, fake):
    user = make_user()
    key, secret = make_key(user)
    _, other_secret = make_key(user, name="another key of the same user")
    gateway = gateway_factory([fake.url], real_capture=True)
    sdk = openai.OpenAI(base_url=gateway.v1, api_key=secret)
    plain = sdk.chat.completions.create(model="clawhub-personal", messages=MSGS)
    streamed = list(sdk.chat.completions.create(model="clawhub-personal", messages=MSGS, stream=True))
    # The completion id names the turn: the same id in every chunk of a stream.
    assert plain.id.startswith("chatcmpl-") and {c.id for c in streamed} == {streamed[0].id} != {plain.id}
    turn = wait_until(lambda: Turn.objects.filter(request_id=plain.id.removeprefix("chatcmpl-")).first())
    wait_until(lambda: Turn.objects.filter(request_id=streamed[0].id.removeprefix("chatcmpl-")).exists())

    def rate(body, with_secret=secret):
        return httpx.post(f"{gateway.v1}/feedback", json=body, timeout=10,
                          headers={"Authorization": f"Bearer {with_secret}"})

    done = rate({"completion_id": plain.id, "thumb": "down", "comment": "Say hello properly."})
    assert done.status_code == 200, done.text
    assert done.json()["turn"] == turn.pk and done.json()["reward"] == -1
    again = rate({"completion_id": plain.id, "score": 2, "thumb": None})
    assert again.status_code == 200 and again.json()["score"] == 2 and again.json()["comment"]
    feedback = ExplicitFeedback.objects.get()
    assert (feedback.source, feedback.key_id, feedback.rated_by_id) == ("gateway", key.pk, user.pk)

    # Another key (even the same user's) does not see this key's completions; errors are OpenAI-shaped.
    refused = rate({"completion_id": plain.id, "thumb": "up"}, with_secret=other_secret)
    assert refused.status_code == 404 and refused.json()["error"]["type"] == "invalid_request_error"
    assert rate({"completion_id": "chatcmpl-nope", "thumb": "up"}).status_code == 404
    assert rate({"thumb": "up"}).status_code == 400
    assert rate({"completion_id": plain.id, "score": 7}).json()["error"]["param"] == "score"
    assert rate({"completion_id": plain.id, "thumb": "up"}, with_secret="chk_nope").status_code == 401
    wrong_method = httpx.get(f"{gateway.v1}/feedback", headers={"Authorization": f"Bearer {secret}"})
    assert wrong_method.status_code == 405

    # A rotated-out secret is inference-only, which is what rating its own completions needs.
    key_rotate(key=key, actor=user)
    late = rate({"completion_id": streamed[0].id, "thumb": "up"})
    assert late.status_code == 200, late.text
    assert ExplicitFeedback.objects.count() == 2
