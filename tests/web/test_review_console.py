"""The review console's filters and bulk decisions, through Django's test client."""

import re

import pytest
from django.test import Client

from clawhub.review.models import Sample
from clawhub.review.services import feedback_submit
from tests.factories import make_user
from tests.review.conftest import make_sample, old_key

pytestmark = pytest.mark.django_db


def test_filters_label_their_own_field_show_feedback_and_bulk_approve_works():
    me = make_user()
    key = old_key(me)
    rated = make_sample(me, key=key, reward=1)
    feedback_submit(actor=me, turn=rated.turn, source="web", thumb="down", comment="Stop apologising.")
    split = make_sample(me, key=key, reward=1, votes=[1, 1, -1], next_text="hmm, maybe")
    client = Client()
    client.force_login(me)
    page = client.get("/review/").content.decode()
    # Each select sits inside the label that names it.
    for name in ("tenant", "flag", "reward", "state"):
        assert re.search(rf'<label for="f-{name}"><span>[^<]+</span>\s*<select id="f-{name}"', page), name
    assert "thumb down" in page and "Stop apologising." in page and "hmm, maybe" in page
    assert "2 samples" in page
    only_rated = client.get("/review/", {"flag": "explicit_overrides_judge"}).content.decode()
    assert f"#{rated.pk}<" in only_rated and f"#{split.pk}<" not in only_rated
    everything = client.get("/review/", {"state": ""}).content.decode()
    assert '<option value="" selected>Any</option>' in everything

    token = client.cookies["csrftoken"].value if "csrftoken" in client.cookies else None
    if token is None:
        client.get("/privacy/")
        token = client.cookies["csrftoken"].value
    response = client.post("/review/bulk/", {"ids": [rated.pk, split.pk], "action": "approve",
                                             "next": "/review/", "csrfmiddlewaretoken": token})
    assert response.status_code == 302
    assert set(Sample.objects.values_list("state", flat=True)) == {Sample.State.APPROVED}
    refused = client.post("/review/bulk/", {"ids": [rated.pk], "action": "reject", "next": "/review/",
                                            "csrfmiddlewaretoken": token}, follow=True)
    assert "Say why" in refused.content.decode()
