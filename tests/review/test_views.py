"""The review console, as a browser uses it (CSRF on)."""

import pytest

from clawhub.review.models import Sample
from tests.review.conftest import make_sample

pytestmark = pytest.mark.django_db


def test_console_lists_the_queue_for_reviewers_only(team, pending_sample, browser_as):
    page = browser_as(team["owner"]).get("/review/")
    assert page.status_code == 200
    html = page.content.decode()
    assert f'href="/review/{pending_sample.pk}/"' in html and "split_votes" in html
    assert team["author"].email in html
    member_page = browser_as(team["member"]).get("/review/")
    assert member_page.status_code == 200
    assert f"/review/{pending_sample.pk}/" not in member_page.content.decode()


def test_console_filters(team, pending_sample, browser_as):
    approved = make_sample(team["author"], key=team["author_key"], reward=1)
    browser = browser_as(team["admin"])
    default = browser.get("/review/").content.decode()  # the queue: pending only
    assert f"/review/{pending_sample.pk}/" in default and f"/review/{approved.pk}/\"" not in default
    approved_only = browser.get("/review/", state="approved", tenant=team["tenant"].pk).content.decode()
    assert f"/review/{approved.pk}/" in approved_only and f"/review/{pending_sample.pk}/" not in approved_only
    flagged = browser.get("/review/", state="", flag="split_votes", reward="-1").content.decode()
    assert f"/review/{pending_sample.pk}/" in flagged and f"/review/{approved.pk}/\"" not in flagged
    assert browser_as(team["member"]).get("/review/", tenant=team["tenant"].pk).status_code == 403
    assert browser_as(team["other"]).get("/review/", tenant=team["tenant"].pk).status_code == 404


def test_sample_page_shows_everything_a_reviewer_needs(team, browser_as):
    sample = make_sample(team["author"], key=team["author_key"], reward=-1, votes=[-1, 1, -1],
                         hints=["Keep answers under three lines."], prompt="Summarise the log file",
                         reply="Here is a 40-line summary", next_text="Too long, I said short")
    html = browser_as(team["owner"]).get(f"/review/{sample.pk}/").content.decode()
    for text in ("Summarise the log file", "Here is a 40-line summary", "Too long, I said short",
                 "Keep answers under three lines.", "split_votes", "\\boxed{-1}", 'value="approve"',
                 'value="reject"'):
        assert text in html, text
    assert browser_as(team["member"]).get(f"/review/{sample.pk}/").status_code == 403
    assert browser_as(team["other"]).get(f"/review/{sample.pk}/").status_code == 404


def test_approve_and_reject_from_the_sample_page(team, pending_sample, browser_as):
    browser = browser_as(team["owner"])
    url = f"/review/{pending_sample.pk}/decide/"
    response = browser.post(url, {"action": "reject", "reason": ""})
    assert response.status_code == 302
    pending_sample.refresh_from_db()
    assert pending_sample.state == "pending"  # a rejection needs a reason
    browser.post(url, {"action": "reject", "reason": "Coordinated downvotes"})
    pending_sample.refresh_from_db()
    assert (pending_sample.state, pending_sample.reason) == ("rejected", "Coordinated downvotes")
    assert browser_as(team["member"]).post(url, {"action": "approve"}).status_code == 403
    pending_sample.refresh_from_db()
    assert pending_sample.state == "rejected"


def test_bulk_form(team, browser_as):
    samples = [make_sample(team["author"], key=team["author_key"], reward=1, votes=[1, 1, 0])
               for _ in range(3)]
    browser = browser_as(team["admin"])
    response = browser.post("/review/bulk/", {"ids": [s.pk for s in samples[:2]], "action": "approve",
                                              "next": "/review/?state=pending"})
    assert response.status_code == 302 and response["Location"] == "/review/?state=pending"
    assert [Sample.objects.get(pk=s.pk).state for s in samples] == ["approved", "approved", "pending"]
    # Off-site "next" is ignored.
    response = browser.post("/review/bulk/", {"ids": [samples[2].pk], "action": "reject", "reason": "dup",
                                              "next": "https://evil.example/"})
    assert response["Location"] == "/review/"


def test_review_mode_form(team, browser_as):
    browser = browser_as(team["owner"])
    browser.post(f"/review/policy/{team['tenant'].pk}/", {"mode": "manual"})
    assert make_sample(team["author"], key=team["author_key"], reward=1).state == "pending"
    assert browser_as(team["member"]).post(f"/review/policy/{team['tenant'].pk}/",
                                           {"mode": "auto"}).status_code == 403


def test_console_needs_login(client):
    assert client.get("/review/").status_code == 302
    assert client.get("/privacy/").status_code == 302
