"""REST API and pages of training and adapters: the permission matrix (staff, owner, admin, member, viewer,
other user) for start, cancel, rollback, pin and settings, and what the pages show."""

import pytest

from clawhub.adapters.models import AdapterPin, AdapterVersion
from clawhub.training.models import TrainingRun
from tests.factories import make_user
from tests.training.conftest import ApiAs, BrowserAs, approved_samples

ROLES = ["staff", "owner", "admin", "member", "viewer", "other"]
MANAGE = {"staff": True, "owner": True, "admin": True, "member": False, "viewer": False, "other": False}


def expected(role: str, ok: int) -> int:
    if MANAGE[role]:
        return ok
    return 404 if role == "other" else 403


@pytest.mark.parametrize("role", ROLES)
def test_start_and_cancel_permissions(team, sent, role):
    tenant = team["tenant"]
    approved_samples(team["member"], 3, tenant=tenant)
    api = ApiAs(team[role])
    response = api.post(f"/api/training/tenants/{tenant.pk}/runs/start/")
    assert response.status_code == expected(role, 201), response.content
    listing = api.get(f"/api/training/tenants/{tenant.pk}/runs/")
    assert listing.status_code == (404 if role == "other" else 200)
    if not MANAGE[role]:
        assert not TrainingRun.objects.exists()
        return
    run = response.json()
    assert run["state"] == "queued" and run["samples"] == 3 and run["backend"] == "local"
    assert listing.json()["results"][0]["id"] == run["id"]
    assert (
        api.post(f"/api/training/tenants/{tenant.pk}/runs/start/").json()["error"]["code"]
        == "run_in_progress"
    )
    for other_role in ("member", "viewer", "other"):
        denied = ApiAs(team[other_role]).post(f"/api/training/runs/{run['id']}/cancel/")
        assert denied.status_code == expected(other_role, 200)
    detail = ApiAs(team["viewer"]).get(f"/api/training/runs/{run['id']}/")
    assert detail.status_code == 200 and detail.json()["sample_ids"] and "config" in detail.json()
    cancelled = api.post(f"/api/training/runs/{run['id']}/cancel/")
    assert cancelled.status_code == 200 and cancelled.json()["state"] == "cancelled"


@pytest.mark.parametrize("role", ROLES)
def test_rollback_and_pin_permissions(team, sent, role, django_capture_on_commit_callbacks):
    tenant = team["tenant"]
    old = AdapterVersion.objects.create(tenant=tenant, version=1, state="retired", artifact_path="/a/v1")
    AdapterVersion.objects.create(tenant=tenant, version=2, state="active", artifact_path="/a/v2")
    api = ApiAs(team[role])
    with django_capture_on_commit_callbacks(execute=True):
        response = api.post(f"/api/adapters/versions/{old.pk}/rollback/")
    assert response.status_code == expected(role, 202), response.content
    if MANAGE[role]:
        assert sent.named("clawhub.train.promote") == [
            ("clawhub.train.promote", [old.pk], {"rollback": True, "actor_id": team[role].pk}, {})
        ]
    else:
        assert sent.calls == []
    pin = api.post(f"/api/adapters/tenants/{tenant.pk}/pin/", {"reason": "stable"})
    assert pin.status_code == expected(role, 200)
    assert AdapterPin.objects.exists() == MANAGE[role]
    if MANAGE[role]:
        assert pin.json() == {"pinned": True, "version": 2, "pinned_by": team[role].email, "reason": "stable"}
        assert api.post(f"/api/adapters/tenants/{tenant.pk}/unpin/").json()["pinned"] is False
    versions = api.get(f"/api/adapters/tenants/{tenant.pk}/versions/")
    assert versions.status_code == (404 if role == "other" else 200)


def test_rollback_refuses_the_active_version(team, sent):
    active = AdapterVersion.objects.create(
        tenant=team["tenant"], version=1, state="active", artifact_path="/a"
    )
    response = ApiAs(team["owner"]).post(f"/api/adapters/versions/{active.pk}/rollback/")
    assert response.status_code == 409 and response.json()["error"]["code"] == "adapter_not_rollbackable"


@pytest.mark.parametrize(
    "role,method_ok,backend_ok",
    [
        ("staff", 200, 200),
        ("owner", 200, 403),
        ("admin", 200, 403),
        ("member", 403, 403),
        ("viewer", 403, 403),
        ("other", 404, 404),
    ],
)
def test_settings_permissions(team, role, method_ok, backend_ok):
    url = f"/api/training/tenants/{team['tenant'].pk}/settings/"
    api = ApiAs(team[role])
    response = api.patch(url, {"method": "rl", "overrides": {"lr": 0.0001}, "batch_size": 8})
    assert response.status_code == method_ok
    if method_ok == 200:
        body = response.json()
        assert body["method"] == "rl" and body["batch_size"] == 8 and body["effective_config"]["lr"] == 0.0001
    assert api.patch(url, {"backend": "tinker"}).status_code == backend_ok
    bad = api.patch(url, {"overrides": {"lr": 7}})
    assert bad.status_code == (400 if method_ok == 200 else method_ok)


def test_personal_tenant_belongs_to_its_user(db, sent):
    me, stranger = make_user(), make_user()
    approved_samples(me, 2)
    assert ApiAs(stranger).post(f"/api/training/tenants/{me.tenant.pk}/runs/start/").status_code == 404
    assert ApiAs(me).post(f"/api/training/tenants/{me.tenant.pk}/runs/start/").status_code == 201


def test_session_writes_need_csrf(db, sent):
    from rest_framework.test import APIClient

    me = make_user()
    approved_samples(me, 1)
    client = APIClient(enforce_csrf_checks=True)
    client.force_login(me)
    assert client.post(f"/api/training/tenants/{me.tenant.pk}/runs/start/").status_code == 403


def test_pages_show_runs_versions_and_only_the_allowed_controls(team, sent):
    tenant = team["tenant"]
    approved_samples(team["member"], 2, tenant=tenant)
    owner = BrowserAs(team["owner"])
    owner.client.get("/training/")  # sets the CSRF cookie
    response = owner.post(f"/training/{tenant.pk}/start/")
    assert response.status_code == 302
    run = TrainingRun.objects.get()
    page = owner.get(f"/training/{tenant.pk}/").content.decode()
    assert f"/training/runs/{run.pk}/" in page and "Start a run now" in page
    detail = owner.get(f"/training/runs/{run.pk}/").content.decode()
    assert "Cancel run" in detail and "queued" in detail
    AdapterVersion.objects.create(
        tenant=tenant, version=1, state="retired", artifact_path="/a", eval_score=0.5
    )
    AdapterVersion.objects.create(
        tenant=tenant, version=2, state="active", artifact_path="/b", eval_score=0.75
    )
    versions = owner.get(f"/adapters/{tenant.pk}/").content.decode()
    assert "Roll back to this" in versions and "score-bar" in versions and f"t{tenant.pk}-v2" in versions

    viewer = BrowserAs(team["viewer"])
    assert "Start a run now" not in viewer.get(f"/training/{tenant.pk}/").content.decode()
    assert "Cancel run" not in viewer.get(f"/training/runs/{run.pk}/").content.decode()
    assert "Roll back to this" not in viewer.get(f"/adapters/{tenant.pk}/").content.decode()
    viewer.client.get("/training/")
    assert viewer.post(f"/training/runs/{run.pk}/cancel/").status_code == 403
    assert BrowserAs(team["other"]).get(f"/adapters/{tenant.pk}/").status_code == 404
    cancel = owner.post(f"/training/runs/{run.pk}/cancel/")
    assert cancel.status_code == 302
    run.refresh_from_db()
    assert run.state == "cancelled"
