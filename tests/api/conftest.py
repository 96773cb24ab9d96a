"""Two users whose data spans several tenants, for the property-based API tests: each has a personal tenant
with sessions, samples, keys, adapter versions and a training run; the first also owns one group and is an
admin of another (so its requests cross three tenants), the second owns a group of its own."""

import hashlib
import secrets
from dataclasses import dataclass, field

import pytest
from django.conf import settings
from django.contrib.auth import HASH_SESSION_KEY
from django.contrib.sessions.backends.db import SessionStore
from django.contrib.sessions.models import Session
from django.test import Client
from django.utils import timezone

from clawhub.adapters.models import AdapterVersion
from clawhub.feedback.models import ExplicitFeedback
from clawhub.groups.models import Role
from clawhub.groups.services import invitation_create
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.keys.scopes import ALL_SCOPES
from clawhub.review.services import feedback_submit
from clawhub.training.models import TrainingRun
from tests.factories import add_member, make_group, make_key, make_user
from tests.review.conftest import approved_sample, make_sample, make_turn, old_key


@dataclass
class Credential:
    """The API key a fuzzing run authenticates with. The fuzzer may revoke, rotate, narrow or expire it (those
    are operations under test); ``header`` then mints a fresh one, so the run goes on as the same user."""

    user: object
    key: ApiKey | None = None
    secret: str = ""
    minted: int = 0

    def _intact(self) -> bool:
        if self.key is None:
            return False
        digest = hashlib.sha256(self.secret.encode()).hexdigest()
        return (ApiKey.objects.filter(pk=self.key.pk, revoked_at=None, expires_at=None, group=None,
                                      scopes=ALL_SCOPES, allowed_models=[], rpm_limit=None, tpm_limit=None,
                                      concurrency_limit=None).exists()
                and ApiKeySecret.objects.filter(key_id=self.key.pk, digest=digest, valid_until=None).exists())

    def header(self) -> dict[str, str]:
        if not self._intact():
            self.key, self.secret = make_key(self.user, name="fuzzer", scopes=ALL_SCOPES)
            self.minted += 1
        return {"Authorization": f"Bearer {self.secret}"}

    def cookies(self) -> dict[str, str]:
        return {}


@dataclass
class SessionCredential:
    """A signed-in browser session with its CSRF token, for the operations only a session may call (sign out,
    sign out everywhere, password change, account deletion). Signing out is under test: ``header`` then signs
    in again."""

    user: object
    session_key: str = ""
    csrf: str = field(default_factory=lambda: secrets.token_hex(16))
    minted: int = 0

    def header(self) -> dict[str, str]:
        return {"X-CSRFToken": self.csrf, "Referer": "http://localhost/"}

    def _valid(self) -> bool:
        # Signing out everywhere (or a password change) moves the user's session auth hash.
        self.user.refresh_from_db()
        store = SessionStore(session_key=self.session_key)
        return (Session.objects.filter(session_key=self.session_key, expire_date__gt=timezone.now()).exists()
                and store.get(HASH_SESSION_KEY) == self.user.get_session_auth_hash())

    def cookies(self) -> dict[str, str]:
        if not self._valid():
            client = Client()
            client.force_login(self.user)
            self.session_key = client.cookies[settings.SESSION_COOKIE_NAME].value
            self.minted += 1
        return {settings.SESSION_COOKIE_NAME: self.session_key, settings.CSRF_COOKIE_NAME: self.csrf}


@dataclass
class World:
    """One user's side: who they are, how they authenticate, and the ids of what they may reach, by the name
    of the path parameter that takes them."""

    user: object
    credential: Credential
    ids: dict[str, list] = field(default_factory=dict)
    session: SessionCredential | None = None


def _adapter_versions(tenant) -> list[AdapterVersion]:
    active = AdapterVersion.objects.create(tenant=tenant, version=1, state=AdapterVersion.State.ACTIVE,
                                           artifact_path=f"/srv/adapters/t{tenant.pk}/v1",
                                           promoted_at=timezone.now())
    candidate = AdapterVersion.objects.create(tenant=tenant, version=2, state=AdapterVersion.State.CANDIDATE,
                                              artifact_path=f"/srv/adapters/t{tenant.pk}/v2", parent=active)
    return [active, candidate]


def _run(tenant, user) -> TrainingRun:
    return TrainingRun.objects.create(tenant=tenant, backend="local", method="combine", base_model="tiny",
                                      started_by=user, state=TrainingRun.State.SUCCEEDED)


def _side(user, groups_owned, groups_admin) -> World:
    tenants = [user.tenant, *(g.tenant for g in groups_owned + groups_admin)]
    groups = groups_owned + groups_admin
    keys = [old_key(user), *(old_key(user, group=g) for g in groups)]
    samples = [approved_sample(user), make_sample(user, key=keys[0], reward=-1)]
    for group in groups:
        member = add_member(group, role=Role.MEMBER)
        samples.append(make_sample(member, key=old_key(member, group=group), reward=-1, votes=[-1, -1, 1],
                                   next_text="That's wrong, redo it."))
    samples = [s for s in samples if s is not None]
    turns = [make_turn(user, key=keys[0]), *(s.turn for s in samples)]
    # One rated turn, so that reading a turn's feedback has something to find.
    feedback_submit(actor=user, turn=turns[0], source=ExplicitFeedback.Source.WEB, thumb="up")
    versions = [v for t in tenants for v in _adapter_versions(t)]
    runs = [_run(t, user) for t in tenants]
    invitations = [invitation_create(actor=user, group=g, role=Role.MEMBER) for g in groups]
    members = [m.user_id for g in groups for m in g.memberships.all()]
    return World(user=user, credential=Credential(user=user), session=SessionCredential(user=user), ids={
        "tenant_id": [t.pk for t in tenants],
        "slug": [g.slug for g in groups],
        "key_id": [k.pk for k in keys],
        "sample_id": [s.pk for s in samples],
        "session_id": sorted({t.session_id for t in turns}),
        "turn_id": [t.pk for t in turns],
        "version_id": [v.pk for v in versions],
        "run_id": [r.pk for r in runs],
        "invitation_id": [inv.pk for inv, _link in invitations],
        "token": [link.rstrip("/").rsplit("/", 1)[1] for _inv, link in invitations],
        "user_id": sorted(set(members)),
    })


@pytest.fixture
def worlds(db, monkeypatch) -> tuple[World, World]:
    """(first user, second user). Celery's send_task is recorded, not sent: no worker takes these tasks."""
    from workers.celery import app

    monkeypatch.setattr(app, "send_task", lambda *args, **kwargs: None)
    first, second, third = make_user(), make_user(), make_user()
    own = make_group(first)
    shared = make_group(third)
    add_member(shared, first, role=Role.ADMIN)
    return _side(first, [own], [shared]), _side(second, [make_group(second)], [])
