import time
from datetime import timedelta

import pytest

from clawhub.accounts.throttle import login_failure_record, login_failures_clear, login_throttle_check
from clawhub.core.exceptions import RateLimited


@pytest.fixture(autouse=True)
def _limit(settings):
    settings.LOGIN_FAILURE_LIMIT = 3
    settings.LOGIN_FAILURE_WINDOW = timedelta(seconds=600)


def test_locks_the_email_at_the_limit_with_a_retry_after_within_the_window():
    for _ in range(2):
        assert login_failure_record(email="a@example.com", ip=None) == []
        login_throttle_check(email="a@example.com", ip=None)
    assert login_failure_record(email="A@Example.com ", ip=None) == ["account_ip"]  # other spelling
    with pytest.raises(RateLimited) as caught:
        login_throttle_check(email="a@example.com", ip=None)
    assert 590 <= caught.value.retry_after <= 600
    # Other addresses are untouched.
    login_throttle_check(email="b@example.com", ip=None)


def test_an_ip_is_locked_across_emails_but_other_ips_are_not(settings):
    settings.LOGIN_FAILURE_IP_LIMIT = 3
    for n in range(3):
        login_failure_record(email=f"guess{n}@example.com", ip="10.0.0.1")
    with pytest.raises(RateLimited):
        login_throttle_check(email="someone-else@example.com", ip="10.0.0.1")
    login_throttle_check(email="someone-else@example.com", ip="10.0.0.2")


def test_an_account_and_address_lock_leaves_the_account_elsewhere_and_the_address_to_others():
    for _ in range(3):
        login_failure_record(email="a@example.com", ip="10.0.0.1")
    with pytest.raises(RateLimited):
        login_throttle_check(email="a@example.com", ip="10.0.0.1")
    login_throttle_check(email="a@example.com", ip="10.0.0.2")
    login_throttle_check(email="b@example.com", ip="10.0.0.1")


def test_a_lock_is_reported_once_and_not_extended_by_later_failures():
    for _ in range(3):
        login_failure_record(email="a@example.com", ip=None)
    assert login_failure_record(email="a@example.com", ip=None) == []


def test_clear_forgets_the_email_failures():
    for _ in range(2):
        login_failure_record(email="a@example.com", ip=None)
    login_failures_clear(email="a@example.com")
    for _ in range(2):
        login_failure_record(email="a@example.com", ip=None)
    login_throttle_check(email="a@example.com", ip=None)  # 2 + 2 failures, but never 3 in a row


def test_the_lock_ends_with_the_window(settings):
    settings.LOGIN_FAILURE_WINDOW = timedelta(seconds=1)
    for _ in range(3):
        login_failure_record(email="a@example.com", ip="10.0.0.9")
    with pytest.raises(RateLimited):
        login_throttle_check(email="a@example.com", ip="10.0.0.9")
    time.sleep(1.2)
    login_throttle_check(email="a@example.com", ip="10.0.0.9")
