"""Finding 6: /admin/ login is under the same lock-out as the site login."""

from datetime import timedelta

import pytest
from django.contrib.auth import get_user_model
from django.test import Client

from clawhub.accounts.models import AuditLog
from tests.factories import PASSWORD

pytestmark = pytest.mark.django_db


def admin_login(client, email, password, ip="10.7.0.1"):
    return client.post("/admin/login/?next=/admin/", {"username": email, "password": password},
                       REMOTE_ADDR=ip)


def signed_in(client) -> bool:
    return client.get("/admin/").status_code == 200


def test_admin_login_locks_out_after_the_limit_even_for_the_right_password(settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_WINDOW = timedelta(minutes=10)
    get_user_model().objects.create_superuser(email="root@example.com", password=PASSWORD)
    client = Client()
    for _ in range(3):
        assert admin_login(client, "root@example.com", "guess").status_code == 200
        assert not signed_in(client)
    locked = admin_login(client, "root@example.com", PASSWORD)
    assert b"Too many failed login attempts" in locked.content
    assert not signed_in(client)
    assert AuditLog.objects.filter(action="auth.lockout").exists()
    # The lock is shared with the site's own login form and API: same email, same address.
    api = Client()  # the test client skips CSRF, so the throttle is what answers
    response = api.post("/api/auth/login/", {"email": "root@example.com", "password": PASSWORD},
                        content_type="application/json", REMOTE_ADDR="10.7.0.1")
    assert response.status_code == 429
    assert not signed_in(api)


def test_a_good_admin_login_still_works_and_clears_the_email(settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    get_user_model().objects.create_superuser(email="root@example.com", password=PASSWORD)
    client = Client()
    admin_login(client, "root@example.com", "guess")
    admin_login(client, "root@example.com", "guess")
    assert admin_login(client, "root@example.com", PASSWORD).status_code == 302
    assert signed_in(client)
    # Both the guesses and the sign-in are in the account's audit log, and the admin session is listed.
    rows = AuditLog.objects.filter(action__in=["auth.login", "auth.login_failed"]).order_by("id")
    assert [(r.action, r.data.get("via")) for r in rows] == [
        ("auth.login_failed", None), ("auth.login_failed", None), ("auth.login", "admin")]
    assert "this browser" in client.get("/account/").content.decode()
