import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from clawhub.accounts.models import User
from clawhub.conversations.models import ConversationSettings
from clawhub.core.updates import model_update
from tests.factories import make_user

pytestmark = pytest.mark.django_db


def test_only_the_changed_fields_are_written_and_returned():
    user = make_user(display_name="Ada")
    User.objects.filter(pk=user.pk).update(store_turns=False)  # behind this instance's back
    with CaptureQueriesContext(connection) as queries:
        changed = model_update(instance=user, fields=["display_name", "training_enabled"],
                               data={"display_name": "Grace", "training_enabled": user.training_enabled})
    assert changed == {"display_name": ("Ada", "Grace")}
    [update] = queries.captured_queries
    assert '"display_name"' in update["sql"] and '"training_enabled"' not in update["sql"]
    row = User.objects.get(pk=user.pk)
    assert (row.display_name, row.store_turns) == ("Grace", False)  # the field it did not set stays


def test_nothing_changed_writes_nothing_and_a_field_outside_fields_is_left_alone():
    user = make_user(display_name="Ada")
    with CaptureQueriesContext(connection) as queries:
        changed = model_update(instance=user, fields=["display_name"],
                               data={"display_name": "Ada", "email": "else@example.com"})
    assert changed == {} and queries.captured_queries == []
    assert user.email != "else@example.com"


def test_auto_now_fields_move_with_a_change():
    row = ConversationSettings.objects.create(tenant=make_user().tenant)
    before = row.updated_at
    assert model_update(instance=row, fields=["include_length_turns"], data={"include_length_turns": True})
    row.refresh_from_db()
    assert row.include_length_turns and row.updated_at > before
