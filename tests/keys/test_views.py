import html
import json
import re
from datetime import timedelta
from urllib.parse import unquote

import pytest
from django.contrib.sessions.models import Session
from django.utils import timezone

from clawhub.groups.models import Role
from clawhub.keys.models import ApiKey, ApiKeySecret
from clawhub.keys.openclaw import SECRET_PLACEHOLDER
from clawhub.keys.selectors import key_resolve
from tests.factories import add_member, make_group, make_key, make_user
from tests.keys.conftest import login

pytestmark = pytest.mark.django_db


def pre(content: str, element_id: str) -> str:
    match = re.search(rf'<pre id="{element_id}">(.*?)</pre>', content, re.S)
    assert match, f"no <pre id={element_id}>"
    return html.unescape(match.group(1))


def browser_post(client, url, data):
    """Posts the way a browser does: the CSRF token comes from the page's form (cookie + hidden field)."""
    page = client.get("/keys/")
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    return client.post(url, {**data, "csrfmiddlewaretoken": token})


def test_keys_page_lists_keys_and_offers_groups_where_the_user_may_bind(web_client):
    user = make_user()
    key, _ = make_key(user, name="laptop")
    make_group(user, name="Mine")
    viewer_of = make_group(name="Watched")
    add_member(viewer_of, user, Role.VIEWER)
    web_client.force_login(user)
    response = web_client.get("/keys/")
    content = response.content.decode()
    assert response.status_code == 200
    assert "laptop" in content and key.display in content and f'href="/keys/{key.pk}/"' in content
    assert '<option value="mine">Mine</option>' in content
    assert "watched" not in content.lower()


def test_create_shows_the_secret_once_and_keeps_it_out_of_the_session(web_client, settings):
    settings.PUBLIC_BASE_URL = "https://hub.example.org"
    user = make_user()
    web_client.force_login(user)
    response = browser_post(web_client, "/keys/", {"name": "desk", "rpm_limit": "20"})
    key = ApiKey.objects.get(owner=user)
    assert response.status_code == 302 and response["Location"] == f"/keys/{key.pk}/secret/"
    response = web_client.get(response["Location"])
    assert response.status_code == 200
    assert response["Cache-Control"] == "no-store"
    content = response.content.decode()
    box = re.search(r'<div class="secret"><code id="key-secret">(chk_[^<]+)</code></div>', content)
    secret = box.group(1)
    assert key_resolve(secret=secret).key == key and key.rpm_limit == 20

    config = json.loads(pre(content, "openclaw-config"))
    provider = config["models"]["providers"]["clawhub"]
    assert provider["apiKey"] == secret and provider["baseUrl"] == "https://hub.example.org/v1"
    onboard = pre(content, "openclaw-onboard")
    assert onboard.startswith("openclaw onboard --non-interactive") and secret in onboard
    link = re.search(r'<a class="button" href="data:application/json;charset=utf-8,([^"]+)" '
                     r'download="openclaw-clawhub.json">', content)
    assert json.loads(unquote(html.unescape(link.group(1)))) == config

    # Nowhere server-side afterwards: not in any session row, not on any later page.
    for session in Session.objects.all():
        assert secret not in json.dumps(session.get_decoded())
        assert secret not in session.session_data
    for url in ("/keys/", f"/keys/{key.pk}/", f"/keys/{key.pk}/openclaw.json", "/dashboard/"):
        later = web_client.get(url)
        assert later.status_code == 200, url
        assert secret not in later.content.decode()


def test_create_form_errors_are_shown_and_nothing_is_created(web_client):
    user = make_user()
    web_client.force_login(user)
    response = browser_post(web_client, "/keys/", {"name": "x", "allowed_models": ["clawhub-group-nope"]})
    assert response.status_code == 400
    assert not ApiKey.objects.exists()
    response = browser_post(web_client, "/keys/", {"name": "x", "allowed_models": ["base"], "rpm_limit": "0"})
    assert response.status_code == 400 and 'class="errorlist"' in response.content.decode()
    assert not ApiKey.objects.exists()


def test_create_group_key_from_the_form(web_client):
    user = make_user()
    group = make_group(user, name="Crew")
    web_client.force_login(user)
    response = browser_post(web_client, "/keys/", {"name": "crew key", "group": "crew",
                                                   "allowed_models": ["clawhub-group-crew", "base"]})
    assert response.status_code == 302
    response = web_client.get(response["Location"])
    key = ApiKey.objects.get(owner=user)
    assert key.group == group and key.allowed_models == ["clawhub-group-crew", "base"]
    config = json.loads(pre(response.content.decode(), "openclaw-config"))
    assert config["agents"]["defaults"]["model"]["primary"] == "clawhub/clawhub-group-crew"


def test_personal_key_cannot_name_a_group_model_in_the_form(web_client):
    user = make_user()
    make_group(user, name="Crew")
    web_client.force_login(user)
    response = browser_post(web_client, "/keys/", {"name": "k", "allowed_models": ["clawhub-group-crew"]})
    assert response.status_code == 400
    assert "Unknown model" in html.unescape(response.content.decode())


def test_detail_page_shows_the_config_with_a_placeholder_and_csrf_protected_buttons(web_client):
    user = make_user()
    key, secret = make_key(user, name="laptop")
    web_client.force_login(user)
    content = web_client.get(f"/keys/{key.pk}/").content.decode()
    assert secret not in content
    config = json.loads(pre(content, "openclaw-config"))
    assert config["models"]["providers"]["clawhub"]["apiKey"] == SECRET_PLACEHOLDER
    assert '"$CLAWHUB_API_KEY"' in pre(content, "openclaw-onboard")
    form = re.search(rf'<form method="post" action="/keys/{key.pk}/edit/"[^>]*>(.*?)</form>', content, re.S)
    assert form and "csrfmiddlewaretoken" in form.group(1)
    for action in ("rotate", "revoke"):  # each asks on a page of its own, whose form is the one that acts
        assert f'href="/keys/{key.pk}/{action}/"' in content, action
        confirm = web_client.get(f"/keys/{key.pk}/{action}/").content.decode()
        form = re.search(rf'<form method="post" action="/keys/{key.pk}/{action}/"[^>]*>(.*?)</form>', confirm,
                         re.S)
        assert form and "csrfmiddlewaretoken" in form.group(1), action
        assert '<input type="hidden" name="confirm" value="yes">' in form.group(1), action
    assert f'href="/keys/{key.pk}/openclaw.json"' in content


def test_download_is_an_attachment_named_openclaw_clawhub_json(web_client):
    user = make_user()
    key, secret = make_key(user)
    web_client.force_login(user)
    response = web_client.get(f"/keys/{key.pk}/openclaw.json")
    assert response.status_code == 200
    assert response["Content-Type"] == "application/json"
    assert response["Content-Disposition"] == 'attachment; filename="openclaw-clawhub.json"'
    body = json.loads(response.content)
    assert body["models"]["providers"]["clawhub"]["apiKey"] == SECRET_PLACEHOLDER
    assert secret not in response.content.decode()


def test_rotate_from_the_web_shows_the_new_secret_once(web_client, settings):
    settings.KEY_ROTATION_GRACE = timedelta(hours=1)
    user = make_user()
    key, old = make_key(user)
    web_client.force_login(user)
    response = browser_post(web_client, f"/keys/{key.pk}/rotate/", {"confirm": "yes"})
    assert response.status_code == 302 and response["Location"] == f"/keys/{key.pk}/secret/"
    content = web_client.get(response["Location"]).content.decode()
    assert "New secret for" in content
    new = re.search(r'<code id="key-secret">(chk_[^<]+)</code>', content).group(1)
    assert new != old and key_resolve(secret=new).key == key
    assert key_resolve(secret=old) is not None  # grace window
    assert json.loads(pre(content, "openclaw-config"))["models"]["providers"]["clawhub"]["apiKey"] == new
    assert new not in web_client.get(f"/keys/{key.pk}/").content.decode()


def test_edit_and_revoke_from_the_web(web_client):
    user = make_user()
    key, secret = make_key(user)
    web_client.force_login(user)
    expiry = (timezone.now() + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M")
    response = browser_post(web_client, f"/keys/{key.pk}/edit/", {
        "name": "renamed", "allowed_models": ["base"], "tpm_limit": "500", "expires_at": expiry})
    assert response.status_code == 302 and response["Location"] == f"/keys/{key.pk}/"
    key.refresh_from_db()
    assert (key.name, key.allowed_models, key.tpm_limit) == ("renamed", ["base"], 500)
    assert key.expires_at.strftime("%Y-%m-%dT%H:%M") == expiry

    bad = browser_post(web_client, f"/keys/{key.pk}/edit/", {"name": "", "allowed_models": ["base"]})
    assert bad.status_code == 400
    assert ApiKey.objects.get(pk=key.pk).name == "renamed"

    response = browser_post(web_client, f"/keys/{key.pk}/revoke/", {"confirm": "yes", "reason": "lost"})
    assert response.status_code == 302
    assert key_resolve(secret=secret) is None
    page = web_client.get(f"/keys/{key.pk}/").content.decode()
    assert "revoked" in page and f'href="/keys/{key.pk}/rotate/"' not in page
    again = browser_post(web_client, f"/keys/{key.pk}/rotate/", {"confirm": "yes"})
    assert again.status_code == 302  # a revoked key is not rotated; the page says why
    assert ApiKeySecret.objects.filter(key=key).count() == 1


def test_web_posts_without_csrf_are_refused(web_client):
    user = make_user()
    key, secret = make_key(user)
    web_client.force_login(user)
    assert web_client.post(f"/keys/{key.pk}/revoke/").status_code == 403
    assert web_client.post("/keys/", {"name": "x"}).status_code == 403
    assert key_resolve(secret=secret) is not None and ApiKey.objects.count() == 1


def test_login_helper_keeps_working(web_client):
    # The matrix tests sign in with the helper; make sure it really passes CSRF on a page view.
    user = make_user()
    key, _ = make_key(user)
    login(web_client, user)
    assert web_client.post(f"/keys/{key.pk}/revoke/", {"confirm": "yes"}).status_code == 302
    assert ApiKey.objects.get(pk=key.pk).revoked_at is not None


def test_a_reload_of_the_secret_page_makes_no_second_key_and_shows_no_secret(web_client):
    user = make_user()
    web_client.force_login(user)
    response = browser_post(web_client, "/keys/", {"name": "desk"})
    secret_page = response["Location"]
    # Between the POST and the page, the session row holds the secret only masked: the pad is the browser's.
    pad = web_client.cookies["clawhub_key_pad"]
    assert pad["path"] == secret_page and pad["httponly"] and pad["samesite"] == "Strict"
    first = web_client.get(secret_page)
    secret = re.search(r'<code id="key-secret">(chk_[^<]+)</code>', first.content.decode()).group(1)
    assert key_resolve(secret=secret) is not None
    reload = web_client.get(secret_page, follow=True)
    assert reload.redirect_chain == [(f"/keys/{ApiKey.objects.get().pk}/", 302)]
    assert secret not in reload.content.decode() and "shown once" in reload.content.decode()
    assert ApiKey.objects.count() == 1
    assert web_client.get(secret_page).status_code == 302  # and so on, each time


def test_the_secret_page_needs_both_the_session_and_the_browsers_pad(web_client):
    user = make_user()
    web_client.force_login(user)
    response = browser_post(web_client, "/keys/", {"name": "desk"})
    del web_client.cookies["clawhub_key_pad"]  # another browser of the same session, or a pad gone stale
    page = web_client.get(response["Location"])
    assert page.status_code == 302 and b'id="key-secret"' not in web_client.get(page["Location"]).content


def test_revoke_and_rotate_ask_for_a_confirmation_first(web_client, settings):
    settings.KEY_ROTATION_GRACE = timedelta(hours=1)
    user = make_user()
    key, secret = make_key(user, name="laptop")
    web_client.force_login(user)
    for action in ("revoke", "rotate"):
        # A post without the confirmation (the old one-click buttons) changes nothing and asks instead.
        response = browser_post(web_client, f"/keys/{key.pk}/{action}/", {})
        assert response.status_code == 302 and response["Location"] == f"/keys/{key.pk}/{action}/"
        page = web_client.get(response["Location"]).content.decode()
        assert "laptop" in page and 'name="confirm" value="yes"' in page
    key.refresh_from_db()
    assert key.revoked_at is None and ApiKeySecret.objects.filter(key=key).count() == 1
    assert key_resolve(secret=secret).key == key
    browser_post(web_client, f"/keys/{key.pk}/revoke/", {"confirm": "yes"})
    assert key_resolve(secret=secret) is None


def _usage(key, model, day, *, requests, prompt, completion, errors=0):
    from clawhub.usage.models import UsageDaily

    return UsageDaily.objects.create(day=day, key=key, user=key.owner, group=key.group,
                                     tenant=key.owner.tenant, model=model, requests=requests, errors=errors,
                                     prompt_tokens=prompt, completion_tokens=completion,
                                     latency_ms_sum=100.0 * requests)


def test_the_key_pages_show_each_keys_own_usage(web_client):
    user = make_user()
    laptop, _ = make_key(user, name="laptop")
    server, _ = make_key(user, name="server")
    other, _ = make_key(make_user(), name="theirs")
    today = timezone.now().date()
    _usage(laptop, "clawhub-personal", today, requests=3, prompt=300, completion=45, errors=1)
    _usage(laptop, "base", today - timedelta(days=2), requests=2, prompt=200, completion=20)
    _usage(laptop, "base", today - timedelta(days=90), requests=7, prompt=700, completion=70)  # out of range
    _usage(server, "base", today, requests=11, prompt=1100, completion=110)
    _usage(other, "base", today, requests=13, prompt=1300, completion=130)
    web_client.force_login(user)

    page = web_client.get(f"/keys/{laptop.pk}/").content.decode()
    totals = re.search(r'id="key-usage-totals">(.*?)</p>', page, re.S).group(1)
    totals = html.unescape(re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", totals)))
    assert "Last 30 days" in totals and "5 requests" in totals and "565 tokens" in totals, totals
    assert "(500 prompt, 65 completion)" in totals and "1 errors" in totals and "100 ms" in totals, totals
    assert "12 requests, 1335 tokens" in page  # since it was made
    assert "<code>clawhub-personal</code>" in page and "<code>base</code>" in page  # by model

    rows = {m.group(1): re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", m.group(2)))
            for m in re.finditer(r'href="/keys/(\d+)/">.*?</a></td>(.*?)</tr>', web_client.get("/keys/")
                                 .content.decode(), re.S)}
    assert " 5 565 " in rows[str(laptop.pk)] and " 11 1210 " in rows[str(server.pk)], rows

    fresh, _ = make_key(user, name="fresh")
    page = web_client.get(f"/keys/{fresh.pk}/").content.decode()
    assert "No requests yet" in page and "12 requests" not in page
