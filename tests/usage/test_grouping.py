"""Every ``by=`` grouping in every format of GET /api/usage/ answers (regression: ``by=group`` raised
``ValueError: The annotation 'group' conflicts with a field on the model`` and gave a 500), with the same
columns in JSON and CSV, and the right sums."""

import csv
import io
from datetime import UTC, datetime

import pytest

from clawhub.usage.selectors import BY, usage_columns
from clawhub.usage.services import usage_record
from tests.conversations.conftest import make_record, user
from tests.factories import make_group, make_key

pytestmark = pytest.mark.django_db

TODAY = datetime.now(tz=UTC).replace(hour=12, minute=0, second=0, microsecond=0)
FORMATS = ("json", "csv", "api")

# What each grouping must say about the world below: (label column, label) -> requests.
EXPECTED = {
    "day": {("day", TODAY.date().isoformat()): 3},
    "model": {("model", "clawhub-personal"): 2, ("model", "clawhub-group-{slug}"): 1},
    "key": {("key_name", "laptop"): 2, ("key_name", "team key"): 1},
    "user": {("user_email", "{email}"): 3},
    "group": {("group_slug", None): 2, ("group_slug", "{slug}"): 1},
}


@pytest.fixture
def world():
    group = make_group()
    owner = group.created_by
    laptop = make_key(owner, name="laptop")[0]
    team = make_key(owner, name="team key", group=group)[0]
    started = TODAY.timestamp()
    usage_record(records=[
        make_record(laptop, [user("a")], started_at=started, prompt_tokens=10, completion_tokens=1),
        make_record(laptop, [user("b")], started_at=started, prompt_tokens=20, completion_tokens=2,
                    status="failed"),
        make_record(team, [user("c")], started_at=started, prompt_tokens=300, completion_tokens=30),
    ])
    return {"owner": owner, "group": group}


def _expected(by: str, world) -> dict:
    fill = {"slug": world["group"].slug, "email": world["owner"].email}
    return {(column, label and label.format(**fill)): n for (column, label), n in EXPECTED[by].items()}


def _rows(response, fmt: str) -> list[dict]:
    if fmt == "json":
        return response.json()["results"]
    if fmt == "csv":
        lines = list(csv.reader(io.StringIO(response.content.decode())))
        return [dict(zip(lines[0], line, strict=True)) for line in lines[1:]]
    return []


@pytest.mark.parametrize("fmt", FORMATS)
@pytest.mark.parametrize("by", BY)
def test_every_grouping_in_every_format(api_client, world, by, fmt):
    api_client.force_login(world["owner"])
    response = api_client.get(f"/api/usage/?by={by}&format={fmt}")
    assert response.status_code == 200, response.content[:500]
    if fmt == "api":  # the browsable page renders the same body
        assert b"total_tokens" in response.content
        return
    rows = _rows(response, fmt)
    assert list(rows[0]) == usage_columns(by=by)
    expected = _expected(by, world)
    column = next(iter(expected))[0]
    # CSV writes None as an empty cell and every number as text.
    got = {(column, row[column] if row[column] != "" else None): int(row["requests"]) for row in rows}
    assert got == expected
    assert sum(int(r["total_tokens"]) for r in rows) == 363
    assert sum(int(r["errors"]) for r in rows) == 1


@pytest.mark.parametrize("by", BY)
def test_an_empty_range_still_has_the_csv_header(api_client, world, by):
    api_client.force_login(world["owner"])
    response = api_client.get(f"/api/usage/?by={by}&format=csv&since=2001-01-01&until=2001-01-31")
    assert response.status_code == 200
    assert list(csv.reader(io.StringIO(response.content.decode()))) == [usage_columns(by=by)]
