"""Groups and privacy in Debian's Chromium: an owner invites by link and a second person accepts it in a
second browser context (their own cookies); a person with no account accepts an invitation sent to their
address, on a site that keeps its mail in a local mailbox; a user downloads their data and deletes one of
their samples. The module's tests share one Chromium."""

import json

import pytest

from clawhub.accounts.selectors import LOCAL_MAILBOX_BACKEND
from clawhub.groups.models import Membership, Role
from clawhub.groups.services import invitation_create
from clawhub.review.models import Sample
from clawhub.review.services import feedback_submit
from tests.factories import PASSWORD, make_group, make_user
from tests.review.conftest import make_sample, old_key
from tests.web.conftest import LAPTOP, chromium_browser


@pytest.fixture(scope="module")
def chromium():
    """One browser for the module (each test opens contexts of its own, so no cookies are shared)."""
    with chromium_browser() as browser:
        yield browser


def sign_in(page, url: str, email: str) -> None:
    page.goto(f"{url}/login/")
    page.fill("input[name=email]", email)
    page.fill("input[name=password]", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url(f"{url}/onboarding/")  # these accounts' first sign-in: "connect OpenClaw"


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_invite_by_link_is_accepted_in_a_second_browser(live_server, chromium, output_dir):
    owner, guest = make_user("owner@example.com"), make_user("guest@example.com")
    first = chromium.new_context(viewport=LAPTOP)
    page = first.new_page()
    sign_in(page, live_server.url, owner.email)
    page.goto(f"{live_server.url}/groups/")
    page.fill("#group-create input[name=name]", "Fruit lab")
    page.click("#group-create button[type=submit]")
    page.wait_for_url(f"{live_server.url}/groups/**/")
    page.click("#invite-form button[type=submit]")  # no email: a link anyone holding it may use once
    link = page.inner_text("#invitation-link pre").strip()
    assert "/invitations/" in link
    page.screenshot(path=str(output_dir / "groups-1-link.png"), full_page=True)

    second = chromium.new_context(viewport=LAPTOP)  # another person: no cookies shared with the owner
    other = second.new_page()
    sign_in(other, live_server.url, guest.email)
    link = live_server.url + link[link.index("/invitations/"):]  # the path, on this test server
    other.goto(link)
    other.click("button[value=accept]")
    other.wait_for_url(f"{live_server.url}/groups/**/")
    assert "Fruit lab" in other.inner_text("main")
    other.screenshot(path=str(output_dir / "groups-2-accepted.png"), full_page=True)
    membership = Membership.objects.get(user=guest)
    assert membership.group.name == "Fruit lab" and membership.role == Role.MEMBER

    page.reload()
    assert guest.email in page.inner_text("main")  # the owner sees the new member
    other.goto(link)
    assert "already" in other.inner_text("main")  # a link works once
    first.close()
    second.close()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_an_email_invitation_is_accepted_by_a_brand_new_person(live_server, chromium, output_dir, settings):
    settings.EMAIL_BACKEND = LOCAL_MAILBOX_BACKEND  # the embedded default: no mail server
    settings.PUBLIC_BASE_URL = live_server.url  # the links in the mails point at this test server
    owner = make_user("host@example.com")
    group = make_group(owner, name="Tea club")
    _invitation, link = invitation_create(actor=owner, group=group, email="newcomer@example.com")
    context = chromium.new_context(viewport=LAPTOP)
    page = context.new_page()
    page.goto(link)  # the link the owner passed on
    page.wait_for_url(f"{live_server.url}/login/**")
    page.click("#signup-link")
    page.fill("input[name=email]", "newcomer@example.com")
    page.fill("input[name=new_password1]", PASSWORD)
    page.fill("input[name=new_password2]", PASSWORD)
    page.click("main button[type=submit]")
    page.locator("#signed-up").wait_for()
    page.fill("input[name=password]", PASSWORD)
    page.click("main button[type=submit]")
    page.wait_for_url(link)  # back at the invitation, not onboarding
    assert "newcomer@example.com" in page.inner_text("#confirm-first")
    page.screenshot(path=str(output_dir / "invite-1-confirm-first.png"), full_page=True)
    page.click("#send-confirmation")
    page.wait_for_url(f"{live_server.url}/mailbox/")
    assert "You are invited to join Tea club" in page.inner_text("main")
    page.screenshot(path=str(output_dir / "invite-2-mailbox.png"), full_page=True)
    page.click("main a[href*='/verify-email/']")
    page.wait_for_url(link)
    page.click("button[value=accept]")
    page.wait_for_url(f"{live_server.url}/groups/**/")
    assert "Welcome to Tea club" in page.inner_text("main")
    page.screenshot(path=str(output_dir / "invite-3-joined.png"), full_page=True)
    membership = Membership.objects.get(user__email="newcomer@example.com")
    assert membership.group == group and membership.role == Role.MEMBER
    context.close()


@pytest.mark.browser
@pytest.mark.django_db(transaction=True)
def test_privacy_export_and_deleting_a_sample(live_server, laptop_page, output_dir):
    me = make_user("pat@example.com")
    keep, drop = make_sample(me, key=old_key(me), reward=1), make_sample(me, key=old_key(me), reward=-1)
    feedback_submit(actor=me, turn=keep.turn, source="api", comment="More detail, please.")
    page = laptop_page
    sign_in(page, live_server.url, me.email)
    page.goto(f"{live_server.url}/privacy/")
    with page.expect_download() as download:
        page.click("a:has-text('Download my data')")
    exported = json.loads(open(download.value.path()).read())
    assert exported["profile"]["email"] == me.email
    assert {s["id"] for s in exported["samples"]} >= {keep.pk, drop.pk}
    assert [f["comment"] for f in exported["explicit_feedback"]] == ["More detail, please."]

    row = page.locator("tr", has_text=f"#{drop.pk}")
    row.locator("a:has-text('Delete')").click()
    page.wait_for_url(f"{live_server.url}/privacy/samples/{drop.pk}/delete/")  # it asks first
    assert Sample.objects.get(pk=drop.pk).state != Sample.State.DELETED
    page.click("#confirm-form button[type=submit]")
    page.wait_for_url(f"{live_server.url}/privacy/")
    assert "deleted" in page.locator("tr", has_text=f"#{drop.pk}").inner_text()
    page.screenshot(path=str(output_dir / "privacy-sample-deleted.png"), full_page=True)
    assert Sample.objects.get(pk=drop.pk).state == Sample.State.DELETED
    assert Sample.objects.get(pk=keep.pk).state == Sample.State.APPROVED
