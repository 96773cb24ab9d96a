"""Account mails leave the request path: the services hand them to the account-mail Celery task on the
housekeeping queue after commit (with the user's id and the kind of mail, no token), and the task makes the
link and sends the mail. The per-address and per-IP limits still decide in the web process whether a mail is
handed over at all."""

import pytest
from django.core import mail

from clawhub.accounts import services
from clawhub.core import tasks
from clawhub.core.task_names import ACCOUNT_MAIL, HOUSEKEEPING_QUEUE, TASK_QUEUES
from tests.factories import make_user
from workers.tasks.mail import send_account_mail


@pytest.fixture
def handed_over(monkeypatch):
    """The real enqueue_on_commit, with Celery's send_task recorded: (name, args, kwargs, options)."""
    from workers.celery import app

    monkeypatch.setattr(services, "enqueue_on_commit", tasks.enqueue_on_commit)
    calls = []
    monkeypatch.setattr(app, "send_task", lambda name, args=None, kwargs=None, **options: calls.append(
        (name, list(args or []), dict(kwargs or {}), options)))
    return calls


def test_a_reset_mail_is_handed_to_the_task_after_commit_and_the_task_sends_it(
        db, handed_over, django_capture_on_commit_callbacks, settings):
    user = make_user("ann@example.com")
    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        services.password_reset_request(email="ann@example.com", ip="203.0.113.5")
        assert handed_over == []  # nothing before the commit
    assert len(callbacks) == 1 and mail.outbox == []  # not sent inline
    [(name, args, kwargs, options)] = handed_over
    assert (name, args, kwargs) == (ACCOUNT_MAIL, [user.pk], {"kind": "password_reset"})
    # Routed by name to the housekeeping queue (the judge workers consume it).
    assert options.get("queue", TASK_QUEUES[name]) == HOUSEKEEPING_QUEUE == TASK_QUEUES[name]
    assert send_account_mail(user.pk, "password_reset") is True
    [sent] = mail.outbox
    assert sent.to == ["ann@example.com"] and f"{settings.PUBLIC_BASE_URL}/" in sent.body


def test_unknown_and_over_limit_addresses_hand_nothing_over(db, handed_over,
                                                            django_capture_on_commit_callbacks, settings):
    settings.ACCOUNT_MAIL_PER_ADDRESS = 2
    make_user("bob@example.com")
    with django_capture_on_commit_callbacks(execute=True):
        services.password_reset_request(email="nobody@example.com", ip="203.0.113.6")
        for _ in range(4):
            services.password_reset_request(email="bob@example.com", ip="203.0.113.6")
    assert [c[2]["kind"] for c in handed_over] == ["password_reset", "password_reset"]


def test_the_task_skips_a_verification_no_longer_needed_and_a_deleted_account(db):
    user = make_user("cy@example.com")
    user.email_verified_at = user.date_joined
    user.save(update_fields=["email_verified_at"])
    assert send_account_mail(user.pk, "verify_email") is False
    assert send_account_mail(987654321, "password_reset") is False
    assert mail.outbox == []
