import pytest
from django.test import Client

from clawhub.keys.models import ApiKeySecret
from clawhub.keys.selectors import key_resolve
from tests.factories import make_key, make_user
from tests.keys.conftest import login

pytestmark = pytest.mark.django_db


@pytest.fixture
def staff_client():
    return login(Client(enforce_csrf_checks=True), make_user(is_staff=True, is_superuser=True))


def test_admin_shows_keys_but_never_digests(staff_client):
    key, secret = make_key(make_user(), name="laptop")
    digest = ApiKeySecret.objects.get(key=key).digest
    for url in ("/admin/keys/apikey/", f"/admin/keys/apikey/{key.pk}/change/"):
        response = staff_client.get(url)
        content = response.content.decode()
        assert response.status_code == 200, url
        assert "laptop" in content and key.display in content
        assert digest not in content and secret not in content
    assert staff_client.get("/admin/keys/apikeysecret/").status_code == 404
    assert staff_client.get("/admin/keys/apikey/add/").status_code == 403


def test_admin_revoke_action_goes_through_the_service(staff_client):
    key, secret = make_key(make_user())
    response = staff_client.post("/admin/keys/apikey/",
                                 {"action": "revoke_keys", "_selected_action": [key.pk]})
    assert response.status_code == 302
    assert key_resolve(secret=secret) is None
    from clawhub.accounts.models import AuditLog

    assert AuditLog.objects.filter(action="key.revoke", target_id=str(key.pk)).exists()
