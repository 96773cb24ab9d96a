"""Builders for test data. They go through the services, so every row comes with its tenant and audit
trail."""

import itertools

from clawhub.accounts.models import User
from clawhub.accounts.services import user_create
from clawhub.groups.models import Group, Membership, Role
from clawhub.groups.services import group_create
from clawhub.keys.models import ApiKey
from clawhub.keys.services import key_create

PASSWORD = "correct-horse-battery-9"
_seq = itertools.count(1)


def make_user(email: str | None = None, *, password: str = PASSWORD, **fields) -> User:
    return user_create(email=email or f"user{next(_seq)}@example.com", password=password, **fields)


def make_group(owner: User | None = None, *, name: str | None = None) -> Group:
    return group_create(actor=owner or make_user(), name=name or f"Group {next(_seq)}")


def add_member(group: Group, user: User | None = None, role: Role = Role.MEMBER) -> User:
    user = user or make_user()
    Membership.objects.create(group=group, user=user, role=role)
    return user


def make_key(owner: User | None = None, **fields) -> tuple[ApiKey, str]:
    return key_create(owner=owner or make_user(), name=fields.pop("name", "test key"), **fields)


def make_run(tenant, **fields):
    """A training run row of the tenant (no task behind it), for samples that must be claimed by a run."""
    from clawhub.training.models import TrainingRun

    defaults = {"backend": "local", "method": "combine", "base_model": "tiny"}
    return TrainingRun.objects.create(tenant=tenant, **{**defaults, **fields})
