"""GET /api/usage/: sums per day/model/key/user, CSV export, and who may see whose usage."""

import csv
import io
from datetime import UTC, datetime, timedelta

import pytest

from clawhub.groups.models import Role
from clawhub.keys.services import key_update
from clawhub.usage.services import usage_record
from tests.conversations.conftest import make_record, user
from tests.factories import add_member, make_group, make_key, make_user

pytestmark = pytest.mark.django_db

TODAY = datetime.now(tz=UTC).replace(hour=12, minute=0, second=0, microsecond=0)


def _record(key, *, days_ago=0, prompt=10, completion=5, **fields):
    started = (TODAY - timedelta(days=days_ago)).timestamp()
    return make_record(
        key, [user("x")], started_at=started, prompt_tokens=prompt, completion_tokens=completion, **fields
    )


@pytest.fixture
def world():
    """A group with an owner, an admin, a member and a viewer; everyone has used a key; plus an outsider."""
    owner = make_user()
    group = make_group(owner)
    admin = add_member(group, role=Role.ADMIN)
    member = add_member(group, role=Role.MEMBER)
    viewer = add_member(group, role=Role.VIEWER)
    outsider = make_user()
    member_personal = make_key(member, name="personal")[0]
    member_group = make_key(member, name="for the group", group=group)[0]
    owner_group = make_key(owner, name="owner's", group=group)[0]
    outsider_key = make_key(outsider)[0]
    usage_record(
        records=[
            _record(member_personal, prompt=100, completion=10),
            _record(member_personal, days_ago=1, prompt=200, completion=20, status="failed"),
            _record(member_group, prompt=1000, completion=100, stream=True, ttft_ms=40.0),
            _record(owner_group, prompt=7, completion=3),
            _record(outsider_key, prompt=5000, completion=500),
            _record(outsider_key, days_ago=90, prompt=1, completion=1),
        ]
    )
    return locals()


def _get(api_client, actor, query=""):
    api_client.force_login(actor)
    return api_client.get(f"/api/usage/{query}")


def test_own_usage_by_day_model_and_key(api_client, world):
    member = world["member"]
    body = _get(api_client, member).json()
    assert body["by"] == "day"
    assert [(r["day"], r["requests"], r["prompt_tokens"]) for r in body["results"]] == [
        (TODAY.date().isoformat(), 2, 1100),
        ((TODAY - timedelta(days=1)).date().isoformat(), 1, 200),
    ]
    assert body["totals"]["total_tokens"] == 1100 + 110 + 200 + 20 + 0
    assert body["totals"]["errors"] == 1 and body["totals"]["streams"] == 1

    by_key = _get(api_client, member, "?by=key").json()["results"]
    assert {r["key_name"]: r["total_tokens"] for r in by_key} == {"personal": 330, "for the group": 1100}
    by_model = _get(api_client, member, "?by=model").json()["results"]
    assert {r["model"]: r["requests"] for r in by_model} == {
        "clawhub-personal": 2,
        f"clawhub-group-{world['group'].slug}": 1,
    }
    narrowed = _get(
        api_client, member, f"?key={world['member_personal'].pk}&since={TODAY.date().isoformat()}"
    )
    assert narrowed.json()["totals"]["requests"] == 1


def test_default_range_and_its_limits(api_client, world):
    outsider = world["outsider"]
    assert _get(api_client, outsider).json()["totals"]["requests"] == 1  # the 90-day-old request is outside
    since = (TODAY - timedelta(days=100)).date().isoformat()
    assert _get(api_client, outsider, f"?since={since}").json()["totals"]["requests"] == 2
    bad = _get(api_client, outsider, "?since=2030-01-02&until=2030-01-01")
    assert bad.status_code == 400 and bad.json()["error"]["code"] == "invalid"
    assert _get(api_client, outsider, "?since=2020-01-01&until=2030-01-01").status_code == 400


def test_nobody_sees_another_users_usage_without_a_role(api_client, world):
    member, outsider = world["member"], world["outsider"]
    assert _get(api_client, member, f"?user={outsider.pk}").status_code == 403
    assert _get(api_client, member, "?all=true").status_code == 403
    assert _get(api_client, outsider, f"?group={world['group'].slug}").status_code == 404
    assert _get(api_client, outsider, "?group=no-such-group").status_code == 404


@pytest.mark.parametrize(("who", "expected_requests"), [("owner", 2), ("admin", 2)])
def test_group_owners_and_admins_see_the_whole_group(api_client, world, who, expected_requests):
    body = _get(api_client, world[who], f"?group={world['group'].slug}&by=user").json()
    rows = {r["user_email"]: r["requests"] for r in body["results"]}
    assert rows == {world["member"].email: 1, world["owner"].email: 1}
    assert body["totals"]["requests"] == expected_requests
    one = _get(api_client, world[who], f"?group={world['group'].slug}&user={world['member'].pk}").json()
    assert one["totals"]["prompt_tokens"] == 1000  # the member's personal key is not the group's business


@pytest.mark.parametrize("who", ["member", "viewer"])
def test_members_see_only_their_part_of_the_group(api_client, world, who):
    body = _get(api_client, world[who], f"?group={world['group'].slug}").json()
    assert body["totals"]["requests"] == (1 if who == "member" else 0)
    other = world["owner"].pk
    assert _get(api_client, world[who], f"?group={world['group'].slug}&user={other}").status_code == 403


def test_staff_see_everything(api_client, world):
    staff = make_user(is_staff=True)
    everything = _get(api_client, staff, "?all=true&by=user").json()
    assert everything["totals"]["requests"] == 5
    assert _get(api_client, staff, f"?user={world['outsider'].pk}").json()["totals"]["prompt_tokens"] == 5000
    assert _get(api_client, staff, f"?group={world['group'].slug}").json()["totals"]["requests"] == 2
    assert _get(api_client, staff).json()["totals"]["requests"] == 0  # by default, staff's own usage


def test_csv_export(api_client, world):
    member = world["member"]
    key_update(key=world["member_personal"], actor=member, name='=HYPERLINK("http://evil")')
    response = _get(api_client, member, "?by=key&format=csv")
    assert response.status_code == 200
    assert response["Content-Type"].startswith("text/csv")
    assert "attachment;" in response["Content-Disposition"]
    rows = list(csv.DictReader(io.StringIO(response.content.decode())))
    assert {r["key_name"] for r in rows} == {'\'=HYPERLINK("http://evil")', "for the group"}
    assert sum(int(r["total_tokens"]) for r in rows) == 1430
    assert {r["avg_ttft_ms"] for r in rows} == {"", "40.0"} and "ttft_ms_sum" not in rows[0]
    refused = _get(api_client, member, f"?user={world['outsider'].pk}&format=csv")
    assert refused.status_code == 403 and b"permission_denied" in refused.content


def test_api_key_auth(api_client, world):
    _, plain = make_key(world["member"])
    assert api_client.get("/api/usage/?by=model", HTTP_AUTHORIZATION=f"Bearer {plain}").status_code == 403
    _, secret = make_key(world["member"], scopes=["read"])
    response = api_client.get("/api/usage/?by=model", HTTP_AUTHORIZATION=f"Bearer {secret}")
    assert response.status_code == 200 and response.json()["totals"]["requests"] == 3
