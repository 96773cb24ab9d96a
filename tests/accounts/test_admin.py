import pytest
from django.test import Client

from clawhub.accounts.models import AuditLog, User
from clawhub.tenants.models import Tenant
from tests.factories import PASSWORD, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def admin_client():
    client = Client()
    client.force_login(make_user("root@example.com", is_staff=True, is_superuser=True))
    return client


def test_user_admin_lists_and_searches_by_email(admin_client):
    make_user("findme@example.com")
    response = admin_client.get("/admin/accounts/user/?q=findme")
    assert response.status_code == 200
    assert b"findme@example.com" in response.content


def test_user_admin_add_creates_the_personal_tenant_and_an_audit_row(admin_client):
    response = admin_client.post("/admin/accounts/user/add/", {
        "email": "Made.By.Admin@Example.com", "password1": PASSWORD, "password2": PASSWORD,
        "usable_password": "true",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    user = User.objects.get(email="made.by.admin@example.com")
    assert user.check_password(PASSWORD)
    assert Tenant.objects.filter(kind="user", user=user).exists()
    assert AuditLog.objects.filter(action="user.admin_create", subject_user=user).exists()


def test_user_admin_change_page_opens(admin_client):
    user = make_user()
    assert admin_client.get(f"/admin/accounts/user/{user.pk}/change/").status_code == 200


def test_audit_log_admin_is_read_only(admin_client):
    row = AuditLog.objects.create(action="test.row", target_type="user", target_id="1")
    assert admin_client.get("/admin/accounts/auditlog/").status_code == 200
    page = admin_client.get(f"/admin/accounts/auditlog/{row.pk}/change/")
    assert page.status_code == 200 and b'name="_save"' not in page.content
    assert admin_client.get("/admin/accounts/auditlog/add/").status_code == 403
    assert admin_client.post(f"/admin/accounts/auditlog/{row.pk}/delete/", {"post": "yes"}).status_code == 403
    assert AuditLog.objects.filter(pk=row.pk).exists()


def test_deactivating_a_user_here_makes_gateways_look_their_keys_up_again(
        admin_client, django_capture_on_commit_callbacks):
    from clawhub.keys.cache import key_cache_generation, key_cache_generation_now
    from tests.factories import make_key

    user, bystander = make_user("leaving@example.com"), make_user("staying@example.com")
    (key, _), (other, _) = make_key(user), make_key(bystander)
    before = {k.pk: key_cache_generation(key_id=k.pk) for k in (key, other)}  # what a gateway's lookup saw
    form = {"email": user.email, "display_name": "", "email_verified_at": "", "is_staff": "",
            "is_superuser": "", "last_login_0": "", "last_login_1": "", "date_joined_0": "2026-01-01",
            "date_joined_1": "00:00:00"}  # is_active left out: unticked
    with django_capture_on_commit_callbacks(execute=True):
        response = admin_client.post(f"/admin/accounts/user/{user.pk}/change/", form)
    assert response.status_code == 302, response.content.decode()[:2000]
    user.refresh_from_db()
    assert not user.is_active
    assert key_cache_generation_now(key_id=key.pk) != before[key.pk]
    assert key_cache_generation_now(key_id=other.pk) == before[other.pk]
