"""The clear secret is stored nowhere: no column of any row of any table, no log line, no cache entry."""

import logging
import re

import pytest
from django.core.cache import cache
from django.db import connection
from rest_framework.test import APIClient

from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_user
from tests.keys.conftest import login

pytestmark = pytest.mark.django_db


def every_cell():
    """(table, column, text) for every value in every table of the database, whoever's app it belongs to."""
    with connection.cursor() as cursor:
        for table in connection.introspection.table_names(cursor):
            cursor.execute(f"SELECT * FROM {connection.ops.quote_name(table)}")
            columns = [c.name for c in cursor.description]
            for row in cursor.fetchall():
                for column, value in zip(columns, row, strict=True):
                    if value is None:
                        continue
                    if isinstance(value, memoryview | bytes):
                        yield table, column, bytes(value).decode("latin-1")
                    else:
                        yield table, column, str(value)


def redis_contents():
    client = cache._cache.get_client(None, write=False)
    for name in client.scan_iter():
        kind = client.type(name)
        value = client.get(name) if kind == b"string" else b""
        yield name, value or b""


def shown_secret(page) -> str:
    return re.search(r'<code id="key-secret">(chk_[^<]+)</code>', page.content.decode()).group(1)


def test_secrets_created_and_rotated_through_the_api_and_web_are_stored_nowhere(caplog, capsys):
    caplog.set_level(logging.DEBUG)
    owner = make_user()
    group = make_group(owner, name="Crew")
    add_member(group, make_user(), Role.MEMBER)
    api = login(APIClient(enforce_csrf_checks=True), owner)

    secrets = []
    personal = api.post("/api/keys/", {"name": "personal", "rpm_limit": 3, "scopes": ["read"]},
                        format="json").json()
    bound = api.post("/api/keys/", {"name": "bound", "group": "crew", "scopes": ["read"]},
                     format="json").json()
    secrets += [personal["secret"], bound["secret"]]
    for created in (personal, bound):
        rotated = api.post(f"/api/keys/{created['key']['id']}/rotate/").json()
        secrets.append(rotated["secret"])
    # Use them, so that authentication and any last-used bookkeeping have run too.
    # The rotated-out secrets (the first two) authenticate but are inference-only; the current ones may read.
    for i, secret in enumerate(secrets):
        answer = APIClient().get("/api/keys/", HTTP_AUTHORIZATION=f"Bearer {secret}").status_code
        assert answer == (403 if i < 2 else 200)
    # And the web flow, which renders the secret from the POST that made it.
    page = api.get("/keys/")  # the HTML page; APIClient is a Django test client underneath
    token = re.search(r'name="csrfmiddlewaretoken" value="([^"]+)"', page.content.decode()).group(1)
    web = api.post("/keys/", {"name": "web", "csrfmiddlewaretoken": token}, format="multipart")
    # Until the page after the redirect shows it, the session holds it masked by a pad only the browser has.
    stashed = list(every_cell())
    web = api.get(web["Location"])
    secrets.append(shown_secret(web))
    # The onboarding page's key crosses its redirect the same way.
    onboarding = api.post("/onboarding/", {"csrfmiddlewaretoken": token}, format="multipart")
    stashed += list(every_cell())
    onboarding = api.get(onboarding["Location"])
    secrets.append(shown_secret(onboarding))
    assert len(set(secrets)) == 6

    cells = list(every_cell()) + stashed
    tables = {table for table, _, _ in cells}
    assert {"keys_apikey", "keys_apikeysecret", "accounts_auditlog", "django_session"} <= tables
    for secret in secrets:
        # The random part alone, so that an encoded or prefixed copy is caught as well.
        needle = secret[len("chk_"):]
        leaks = [(table, column) for table, column, text in cells if needle in text]
        assert leaks == [], f"secret found in {leaks}"
        assert needle not in caplog.text
        for name, value in redis_contents():
            assert needle.encode() not in name and needle.encode() not in value
    out, err = capsys.readouterr()
    for secret in secrets:
        assert secret[4:] not in out and secret[4:] not in err
