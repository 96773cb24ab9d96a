"""Builders for review tests: turns and judgments written straight through the ORM (as capture and the judge
task would leave them), and clients that carry CSRF tokens the way a browser or a script does."""

import itertools
from datetime import timedelta

import pytest
from django.test import Client
from django.utils import timezone

from clawhub.conversations.models import Session, Turn
from clawhub.feedback.models import Judgment
from clawhub.groups.models import Role
from clawhub.keys.models import ApiKey
from clawhub.review.models import Sample
from clawhub.review.services import sample_create_for_judgment
from clawhub.tenants.models import Tenant
from tests.factories import add_member, make_key

_seq = itertools.count(1)


def old_key(owner, **fields) -> ApiKey:
    """A key created well before the new-key guard's threshold, so it raises no flag by itself."""
    key = make_key(owner, **fields)[0]
    ApiKey.objects.filter(pk=key.pk).update(created_at=timezone.now() - timedelta(days=30))
    key.refresh_from_db()
    return key


def make_turn(user, *, key: ApiKey | None = None, tenant: Tenant | None = None, prompt: str | None = None,
              reply: str = "Here you go.", next_text: str | None = "Thanks, that works.",
              turn_type: str = Turn.Type.MAIN, created_at=None) -> Turn:
    """A served main turn with its next state, in a session of its own."""
    n = next(_seq)
    tenant = tenant or (key.group.tenant if key is not None and key.group_id else user.tenant)
    created_at = created_at or timezone.now()
    session = Session.objects.create(tenant=tenant, key=key, user=user, external_id=f"s-{n}",
                                     started_at=created_at, last_activity_at=created_at, turn_count=1)
    messages = [{"role": "system", "content": "You are a helpful agent."},
                {"role": "user", "content": prompt or f"question {n} from {user.email}"}]
    return Turn.objects.create(
        session=session, tenant=tenant, key=key, user=user, index=0, turn_type=turn_type,
        request_id=f"req-review-{n}", route="chat", model=tenant.model_id,
        request={"messages": messages, "tools": [{"type": "function", "function": {"name": "ls"}}]},
        response=[{"index": 0, "finish_reason": "stop", "message": {"role": "assistant", "content": reply}}],
        prompt_tokens=12, completion_tokens=4, status=Turn.Status.COMPLETE, http_status=200, latency_ms=50.0,
        created_at=created_at,
        next_state=[{"role": "user", "content": next_text}] if next_text is not None else None,
        next_state_at=created_at if next_text is not None else None,
        closed_without_next=next_text is None,
    )


def make_judgment(turn: Turn, *, reward: int = 1, votes=None, hints=None, status="ok") -> Judgment:
    votes = [reward] * 3 if votes is None else votes
    return Judgment.objects.create(
        turn=turn, tenant=turn.tenant, reward=reward, votes=votes, hints=hints or [], judge="rule",
        prompt_version="test-v1", raw_outputs={"prm": [f"\\boxed{{{v}}}" for v in votes]}, status=status,
    )


def make_sample(user, *, key: ApiKey | None = None, tenant: Tenant | None = None, reward: int = 1,
                votes=None, hints=None, next_text: str | None = None, **turn_fields) -> Sample | None:
    """A judged turn run through the real sample_create_for_judgment (policy and guards included)."""
    turn = make_turn(user, key=key, tenant=tenant,
                     next_text=next_text if next_text is not None else f"reply {next(_seq)}", **turn_fields)
    return sample_create_for_judgment(judgment_id=make_judgment(turn, reward=reward, votes=votes,
                                                                hints=hints).pk)


def approved_sample(user, *, key: ApiKey | None = None, tenant: Tenant | None = None, created_at=None,
                    reward: int = 1) -> Sample:
    """An approved sample written directly (no guards), with an explicit age for ordering tests."""
    turn = make_turn(user, key=key, tenant=tenant, next_text=f"reply {next(_seq)}")
    judgment = make_judgment(turn, reward=reward)
    return Sample.objects.create(turn=turn, judgment=judgment, tenant=turn.tenant, user=user, key=key,
                                 reward=reward, state=Sample.State.APPROVED,
                                 created_at=created_at or timezone.now())


@pytest.fixture
def team(every_role):
    """``every_role`` (a group with one user of each role, an outsider, a site staff member) and a second
    member ("author") whose group turn becomes a pending sample."""
    people = dict(every_role)
    people["author"] = add_member(people["group"], role=Role.MEMBER)
    people["author_key"] = old_key(people["author"], group=people["group"])
    return people


@pytest.fixture
def pending_sample(team) -> Sample:
    sample = make_sample(team["author"], key=team["author_key"], reward=-1, votes=[-1, -1, 1],
                         next_text="That's wrong, redo it.")
    assert sample.state == Sample.State.PENDING  # split votes hold it under the group's "flagged" mode
    return sample


class ApiAs:
    """A logged-in script on /api/ with session auth: fetches the CSRF token once and sends it on writes."""

    def __init__(self, user):
        from rest_framework.test import APIClient

        self.client = APIClient(enforce_csrf_checks=True)
        self.client.force_login(user)
        self.token = self.client.get("/api/auth/csrf/").json()["csrf_token"]

    def get(self, url, **params):
        return self.client.get(url, params)

    def post(self, url, data=None):
        return self.client.post(url, data or {}, format="json", HTTP_X_CSRFTOKEN=self.token)

    def patch(self, url, data=None):
        return self.client.patch(url, data or {}, format="json", HTTP_X_CSRFTOKEN=self.token)

    def delete(self, url):
        return self.client.delete(url, HTTP_X_CSRFTOKEN=self.token)


class BrowserAs:
    """Django's test client with CSRF checks on, logged in; posts carry the token a rendered form carries."""

    def __init__(self, user):
        self.client = Client(enforce_csrf_checks=True)
        self.client.force_login(user)

    def get(self, url, **params):
        return self.client.get(url, params)

    def post(self, url, data=None, **extra):
        if "csrftoken" not in self.client.cookies:
            self.client.get("/privacy/")
        token = self.client.cookies["csrftoken"].value
        return self.client.post(url, {**(data or {}), "csrfmiddlewaretoken": token}, **extra)


@pytest.fixture
def api_as():
    return ApiAs


@pytest.fixture
def browser_as():
    return BrowserAs
