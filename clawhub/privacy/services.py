"""Writes for a user's control over their own data: withdrawing a sample, the training and storage
switches (for the account and per key), and deleting the account with everything that is theirs.

Every change is audited (``clawhub.accounts.audit``); capture reads the switches through
``clawhub.conversations.privacy.capture_allowed``.
"""

import logging
import shutil
from dataclasses import dataclass
from dataclasses import field as dataclass_field
from pathlib import Path

from django.conf import settings
from django.db import transaction

from clawhub.accounts.models import AuditLog, MailboxMessage, User
from clawhub.accounts.services import audit_record
from clawhub.core.exceptions import Conflict, NotFound, PermissionDenied
from clawhub.core.updates import model_update
from clawhub.groups.models import Group, Membership, Role
from clawhub.keys.models import ApiKey
from clawhub.review.models import Sample
from clawhub.tenants.models import Tenant

logger = logging.getLogger("clawhub.privacy")


@transaction.atomic
def sample_delete_own(*, actor: User, sample_id: int, ip: str | None = None) -> Sample:
    """The user withdraws one of their samples: it is never offered for training again. The turn stays
    (the user still sees their conversation); a sample already trained on stays in that adapter version."""
    sample = (Sample.objects.select_for_update(of=("self",)).select_related("tenant")
              .filter(pk=sample_id, user=actor).first())
    if sample is None:
        raise NotFound("No such sample.")
    if sample.state != Sample.State.DELETED:
        previous = sample.state
        sample.state = Sample.State.DELETED
        sample.save(update_fields=["state"])
        audit_record(actor=actor, action="sample.delete", target=sample, subject_user=actor,
                     group=sample.tenant.group if sample.tenant.group_id else None, ip=ip,
                     previous_state=previous)
    return sample


@transaction.atomic
def privacy_update(*, actor: User, training_enabled: bool | None = None, store_turns: bool | None = None,
                   ip: str | None = None) -> User:
    """The user's own switches: train on my data at all, and store my turns at all. Turning storage off
    also stops training (nothing stored, nothing to learn from); capture reads both through
    ``clawhub.conversations.privacy.capture_allowed``."""
    user = User.objects.select_for_update().get(pk=actor.pk)
    switches = {"training_enabled": training_enabled, "store_turns": store_turns}
    asked = {field: bool(value) for field, value in switches.items() if value is not None}
    changed = model_update(instance=user, fields=list(switches), data=asked)
    if changed:
        audit_record(actor=actor, action="user.privacy", target=user, subject_user=user, ip=ip,
                     **{field: {"old": old, "new": new} for field, (old, new) in changed.items()})
    actor.training_enabled, actor.store_turns = user.training_enabled, user.store_turns
    return user


@transaction.atomic
def key_training_set(*, actor: User, key_id: int, training_enabled: bool, ip: str | None = None) -> ApiKey:
    """Switches training on or off for what one of the actor's own keys sends."""
    key = ApiKey.objects.select_for_update().filter(pk=key_id, owner=actor).first()
    if key is None:
        raise NotFound("No such key.")
    if model_update(instance=key, fields=["training_enabled"],
                    data={"training_enabled": bool(training_enabled)}):
        audit_record(actor=actor, action="key.training", target=key, subject_user=actor, group=key.group,
                     ip=ip, training_enabled=key.training_enabled)
    return key


@transaction.atomic
def account_delete(*, actor: User, password: str, ip: str | None = None) -> "DeletionReport":
    """The user deletes their own account (``user_delete``), after typing their password again."""
    user = User.objects.select_for_update().get(pk=actor.pk)
    if not password or not user.check_password(password):
        raise PermissionDenied("The password is wrong.", code="wrong_password", field="password",
                               fields={"password": ["The password is wrong."]})
    return user_delete(user=user, actor=user, ip=ip)


@dataclass
class DeletionReport:
    """What a deletion removed beyond the rows, and what stays (said on the page and in the API)."""

    adapters_unloaded: list[str] = dataclass_field(default_factory=list)
    paths_removed: list[str] = dataclass_field(default_factory=list)
    # Shared adapters of groups the user was in but did not own alone: trained partly on their samples, and
    # kept, because they are the other members' too. Their samples in those groups are deleted.
    groups_kept: list[str] = dataclass_field(default_factory=list)


@transaction.atomic
def user_delete(*, user: User, actor: User | None, ip: str | None = None) -> DeletionReport:
    """Deletes an account and everything that is theirs: keys (revoked first so that gateways drop them at
    once), personal tenant with its adapter versions, their weights on disk, the training workdirs and the
    adapters loaded on the upstreams; sessions, turns, judgments and samples (also those in group tenants),
    usage and memberships. Groups they own alone go the same way; a group they own with other members must
    be handed over first, whoever deletes them (the user, or staff in Django admin). Audit rows stay, for the
    groups and the site, with the user's own name scrubbed by id.
    """
    from clawhub.groups.services import group_delete
    from clawhub.keys.services import key_revoke

    user = User.objects.select_for_update().get(pk=user.pk)
    owned = list(Group.objects.filter(memberships__user=user, memberships__role=Role.OWNER))
    shared = [g for g in owned if Membership.objects.filter(group=g).exclude(user=user).exists()]
    if shared:
        raise Conflict(
            "The account owns groups with other members: transfer their ownership before deleting it.",
            code="owner_must_transfer", groups=[g.slug for g in shared],
        )
    report = DeletionReport(groups_kept=sorted(
        Group.objects.filter(memberships__user=user).exclude(pk__in=[g.pk for g in owned])
        .values_list("slug", flat=True)))
    tenants = [user.tenant, *(g.tenant for g in owned)]
    leftovers = _tenant_leftovers(tenants=tenants)
    for group in owned:
        group_delete(actor=user, group=group, ip=ip)
    for key in ApiKey.objects.filter(owner=user, revoked_at__isnull=True).select_related("owner", "group"):
        key_revoke(key=key, actor=actor or user, ip=ip, reason="account deleted")
    email, pk = user.email, user.pk
    # The user's name lives on in audit rows' snapshots; the actions stay, the person does not. Only the rows
    # whose target is this user, by id: a substring of the email would also hit ann@ inside joann@.
    AuditLog.objects.filter(target_type="user", target_id=str(pk)).update(target_repr="(deleted user)")
    for row in AuditLog.objects.filter(data__email=email):
        row.data = {**row.data, "email": ""}
        row.save(update_fields=["data"])
    # Mail the local mailbox kept for the address (the embedded default) goes too: whoever signs up with it
    # next must not read this account's links and invitations.
    MailboxMessage.objects.filter(to_email=email).delete()
    user.delete()
    audit_record(actor=actor if actor is not None and actor.pk != pk else None, action="user.delete",
                 target=None, ip=ip, user_id=pk, adapters=len(leftovers[0]), groups_kept=report.groups_kept)
    # Files and loaded adapters go once the rows are gone for good: a rolled-back deletion keeps them.
    transaction.on_commit(lambda: _remove_leftovers(*leftovers, report=report))
    transaction.on_commit(lambda: _scrub_capture_spool(user_id=pk))
    return report


def capture_spool_scrub_deleted() -> int:
    """Empties the acknowledged records of accounts that no longer exist from this host's capture spool: those
    a deletion could not reach because the consumer acknowledged them after it. Run by the daily retention
    purge. Returns how many records were emptied."""
    from clawhub.conversations.capture.spool import spool_scrub

    known: dict[int, bool] = {}

    def gone(record) -> bool:
        if record.user_id not in known:
            known[record.user_id] = not User.objects.filter(pk=record.user_id).exists()
        return known[record.user_id]

    return spool_scrub(Path(settings.CAPTURE_SPOOL_DIR), gone)


def _scrub_capture_spool(*, user_id: int) -> None:
    """Empties the user's turns already stored from this host's capture spool (the embedded stack's hand-off,
    and a gateway's fallback while Redis is away), where they would otherwise stay until their segment fills
    up. A spool on another host (a gateway replica's fallback) is not reached from here; records not yet
    stored are left to the consumer, which stores nothing of a user who is gone."""
    from clawhub.conversations.capture.spool import spool_scrub_user

    try:
        scrubbed = spool_scrub_user(Path(settings.CAPTURE_SPOOL_DIR), user_id)
    except OSError:
        logger.exception("account deletion: the capture spool could not be scrubbed of user %s", user_id)
        return
    if scrubbed:
        logger.info("account deletion: %d captured turns of user %s emptied in the spool", scrubbed, user_id)


def deletion_summary(report: DeletionReport) -> str:
    """What the user is told once their account is gone: what went, and honestly what stays."""
    text = ("Your account and all your data have been deleted: keys, conversations, samples, usage, your "
            "personal adapter (its weights and training files included) and the groups you owned alone.")
    if report.groups_kept:
        text += (" The shared adapters of " + ", ".join(report.groups_kept) + " stay with their other "
                 "members; they were trained partly on your samples, which are deleted.")
    return text


def _tenant_leftovers(*, tenants: list[Tenant]) -> tuple[list[str], list[Path]]:
    """The upstream names of every adapter version of these tenants, and the folders that hold their weights
    and training state (each version's artifact, the tenant's adapter folder, each run's workdir)."""
    from clawhub.adapters.models import AdapterVersion
    from clawhub.adapters.services import artifact_dir
    from clawhub.training.models import TrainingRun

    versions = list(AdapterVersion.objects.filter(tenant__in=tenants))
    paths = [Path(v.artifact_path) for v in versions if v.artifact_path]
    paths += [artifact_dir(tenant_id=t.pk, version=0).parent for t in tenants]
    paths += [Path(w) for w in TrainingRun.objects.filter(tenant__in=tenants).exclude(workdir="")
              .values_list("workdir", flat=True)]
    return [v.upstream_name for v in versions], paths


def _inside_data_dirs(path: Path) -> bool:
    # Only what ClawHub wrote: an artifact_path pointing anywhere else (a shared model folder) is left alone.
    roots = [Path(settings.CLAWHUB_ADAPTER_DIR).resolve(), Path(settings.CLAWHUB_TRAIN_WORKDIR).resolve()]
    resolved = path.resolve()
    return any(resolved != root and resolved.is_relative_to(root) for root in roots)


def _remove_leftovers(names: list[str], paths: list[Path], *, report: DeletionReport) -> None:
    from clawhub.adapters import serving

    upstreams = serving.configured_upstreams()
    for name in names:
        if all(serving.unload_adapter(up, name=name) for up in upstreams):
            report.adapters_unloaded.append(name)
        else:
            logger.warning("account deletion: adapter %s may still be loaded on an upstream", name)
    for path in paths:
        if not path.exists():
            continue
        if not _inside_data_dirs(path):
            logger.warning("account deletion: %s is outside the adapter and training folders; left", path)
            continue
        shutil.rmtree(path, ignore_errors=True)
        if not path.exists():
            report.paths_removed.append(str(path))
