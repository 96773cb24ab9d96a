"""What the pages show about fidelity: per turn how it ended, what it is linked to and what its training
sample is built from; per tenant on the training page, samples from served ids vs re-rendered (and why)."""

import pytest
from django.test import Client

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session, Turn
from tests.conversations.conftest import approved_sample, assistant, make_record, user

pytestmark = pytest.mark.django_db


def test_turns_show_ending_link_and_training_source(key):
    first = make_record(
        key, [user("name a colour")], reply="Blue.", prompt_token_ids=[1, 2], token_ids=[5, 6]
    )
    regen = make_record(key, [user("name a colour")], reply="Red.")  # served without ids (another backend)
    cut = make_record(key, [user("name a colour"), assistant("Red."), user("a long story")], reply="Once")
    cut.choices[0]["finish_reason"] = "length"
    cut.api = "messages"  # Claude Code's request, served as this chat turn
    capture_store([first, regen, cut])
    browser = Client()
    browser.force_login(key.owner)
    page = browser.get(f"/conversations/{Session.objects.get(user=key.owner).pk}/").text
    turns = {r.request_id: Turn.objects.get(request_id=r.request_id) for r in (first, regen, cut)}
    article = {rid: page.split(f'id="turn-{t.pk}"')[1].split("</article>")[0] for rid, t in turns.items()}
    assert "ended: stop" in article[first.request_id] and "starts a conversation" in article[first.request_id]
    assert "training sample: served ids" in article[first.request_id]
    assert (
        "regenerate of" in article[regen.request_id]
        and f"#turn-{turns[first.request_id].pk}" in article[regen.request_id]
    )
    assert "training sample: re-rendered (served without prompt token ids)" in article[regen.request_id]
    assert "ended: length" in article[cut.request_id] and "cut: not judged" in article[cut.request_id]
    assert "next state of" in article[cut.request_id]
    assert "via Anthropic Messages" in article[cut.request_id]
    assert "via Chat Completions" in article[first.request_id]

    for turn in turns.values():
        approved_sample(turn)
    training = browser.get(f"/training/{key.owner.tenant.pk}/").text
    assert "Samples from served token ids: <strong>1</strong>" in training
    assert (
        "re-rendered with the chat template: <strong>2</strong> (served without prompt token ids: 2)"
        in training
    )


def test_the_length_setting_through_the_api(key):
    from rest_framework.test import APIClient

    from tests.factories import make_user

    api_client = APIClient()  # CSRF is the API's business, tested there

    url = f"/api/conversations/tenants/{key.owner.tenant.pk}/settings/"
    api_client.force_login(key.owner)
    assert api_client.get(url).json() == {"tenant_id": key.owner.tenant.pk, "include_length_turns": False}
    response = api_client.patch(url, {"include_length_turns": True}, format="json")
    assert response.status_code == 200, response.json()
    assert response.json()["include_length_turns"] is True
    from clawhub.conversations.models import ConversationSettings

    assert ConversationSettings.objects.get(tenant=key.owner.tenant).include_length_turns
    api_client.force_login(make_user())
    assert api_client.patch(url, {"include_length_turns": False}, format="json").status_code in (403, 404)
