"""Regressions the property-based run found, pinned: each answers with the API's JSON error body, not a 500
or Django's HTML page."""

import pytest

from clawhub.keys.models import ApiKey
from clawhub.keys.scopes import ALL_SCOPES
from tests.factories import make_key, make_user

pytestmark = pytest.mark.django_db


@pytest.fixture
def bearer():
    _key, secret = make_key(make_user(), scopes=ALL_SCOPES)
    return {"HTTP_AUTHORIZATION": f"Bearer {secret}"}


def _error(response) -> dict:
    assert response["Content-Type"].startswith("application/json"), response["Content-Type"]
    return response.json()["error"]


def test_a_key_limit_beyond_a_database_integer_is_400_not_500(api_client, bearer):
    response = api_client.post("/api/keys/", {"name": "k", "rpm_limit": 2**62}, format="json", **bearer)
    assert response.status_code == 400 and "rpm_limit" in _error(response)["data"]["fields"]
    assert ApiKey.objects.filter(name="k").count() == 0


@pytest.mark.parametrize("path", ["/api/nowhere/", "/api/keys/3.5e-299/", "/api/groups/%C3%99/keys/"])
def test_an_unknown_api_url_is_a_json_404(api_client, bearer, path):
    response = api_client.get(path, **bearer)
    assert response.status_code == 404 and _error(response)["code"] == "not_found"


def test_an_unknown_format_is_a_json_404(api_client, bearer):
    response = api_client.get("/api/usage/?format=bogus", **bearer)
    assert response.status_code == 404 and _error(response)["code"] == "not_found"


def test_a_usage_error_asked_for_as_csv_is_csv(api_client, bearer):
    response = api_client.get("/api/usage/?format=csv&since=2020-01-01&until=2019-01-01", **bearer)
    assert response.status_code == 400 and response["Content-Type"].startswith("text/csv")
    assert response.content.decode().splitlines()[0] == "error,message"
