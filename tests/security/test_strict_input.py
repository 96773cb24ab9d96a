"""Strict input (the security round's schemathesis findings): the server takes what the OpenAPI document says.

Schema-invalid requests that DRF used to coerce are refused (400), and schema-valid ones it refused are either
accepted or no longer in the schema. Each case is one request; the full schemathesis run lives in tests/api.
"""

import pytest

from clawhub.feedback.models import JudgeRules
from clawhub.groups.models import Group
from clawhub.keys.models import ApiKey
from tests.factories import make_group, make_user
from tests.review.conftest import ApiAs

pytestmark = pytest.mark.django_db


def refused(response, field: str | None = None) -> bool:
    if response.status_code != 400:
        return False
    return field is None or field in (response.json()["error"]["data"].get("fields") or {field: 1})


def test_numbers_are_not_taken_for_text_nor_for_booleans():
    user = make_user()
    api = ApiAs(user)
    assert refused(api.post("/api/keys/", {"name": 0}), "name")
    assert refused(api.post("/api/groups/", {"name": 0}), "name")
    assert refused(api.post("/api/groups/", {"name": "Crew", "slug": 0}), "slug")
    assert not ApiKey.objects.exists() and not Group.objects.exists()
    assert refused(api.patch("/api/me/privacy/", {"training_enabled": 0}), "training_enabled")
    assert refused(api.patch("/api/me/privacy/", {"store_turns": 1}), "store_turns")
    assert refused(api.client.put("/api/judge-rules/", {"extend_defaults": 0}, format="json",
                                  HTTP_X_CSRFTOKEN=api.token), "extend_defaults")
    assert not JudgeRules.objects.exists()
    assert refused(api.post("/api/keys/", {"name": "k", "rpm_limit": "5"}), "rpm_limit")
    key = api.post("/api/keys/", {"name": "k", "rpm_limit": 5.0}).json()["key"]  # 5.0 is an integer in JSON
    assert key["rpm_limit"] == 5
    assert refused(api.post(f"/api/keys/{key['id']}/revoke/", {"reason": 0}), "reason")
    user.refresh_from_db()
    assert user.training_enabled and user.store_turns


def test_an_empty_profile_patch_is_refused():
    api = ApiAs(make_user(display_name="Ann"))
    assert refused(api.patch("/api/me/", {}))
    assert api.patch("/api/me/", {"display_name": "Bo"}).json()["display_name"] == "Bo"


@pytest.mark.parametrize("query", ["page_size=null", "page_size=", "page=first", "page_size=0"])
def test_a_page_or_page_size_that_is_not_a_positive_integer_is_refused(query):
    response = ApiAs(make_user()).get(f"/api/audit/?{query}")
    assert response.status_code == 400, response.content


@pytest.mark.parametrize("url", ["/api/sessions/?limit=null", "/api/sessions/?offset=-1"])
def test_a_limit_or_offset_that_is_not_a_count_is_refused(url):
    assert ApiAs(make_user()).get(url).status_code == 400


@pytest.mark.parametrize("url", ["/api/sessions/?type=", "/api/review/samples/?state="])
def test_an_empty_choice_in_the_query_is_refused(url):
    owner = make_user()
    make_group(owner)
    assert ApiAs(owner).get(url).status_code == 400


def test_what_the_server_refuses_the_schema_forbids():
    """NUL characters (DRF refuses them in every text field), an invitation as owner (always refused), a page
    below 1 and an empty profile change: each is now outside the schema, where schemathesis does not send it
    as a valid request."""
    from drf_spectacular.generators import SchemaGenerator

    schema = SchemaGenerator().get_schema(request=None, public=True)
    components = schema["components"]["schemas"]
    assert components["KeyCreateInput"]["properties"]["name"]["not"] == {"pattern": "\\u0000"}
    assert "owner" not in str(components["InvitationCreateInput"]["properties"]["role"])
    assert components["MeUpdateInput"]["required"] == ["display_name"]
    audit = {p["name"]: p["schema"] for p in schema["paths"]["/api/audit/"]["get"]["parameters"]}
    assert audit["page"]["minimum"] == 1 and audit["page_size"]["minimum"] == 1
    owner = make_user()
    group = make_group(owner)
    response = ApiAs(owner).post(f"/api/groups/{group.slug}/invitations/", {"role": "owner"})
    assert response.status_code == 400 and "owner" in response.json()["error"]["message"]


def test_transferring_a_group_to_its_owner_is_a_conflict_not_invalid_input():
    """A schema-valid user id the group's state refuses (the caller already owns it) is 409, which the
    schema's check for valid input accepts, not 400 (schemathesis found it when the owner's id was 1)."""
    owner = make_user()
    group = make_group(owner)
    response = ApiAs(owner).post(f"/api/groups/{group.slug}/transfer/", {"user_id": owner.pk})
    assert response.status_code == 409 and response.json()["error"]["code"] == "already_owner"


def _request_schema(component: str) -> dict:
    """A request body's schema, with the document's components its references point into."""
    from drf_spectacular.generators import SchemaGenerator

    components = SchemaGenerator().get_schema(request=None, public=True)["components"]
    return {**components["schemas"][component], "components": components}


def _valid(schema: dict, value) -> bool:
    """As a tester that generates from the document judges it: jsonschema_rs, whose patterns are ECMA 262's
    (schemathesis validates with it)."""
    import jsonschema_rs

    return jsonschema_rs.Draft202012Validator(schema).is_valid(value)


# Characters Python's str.strip() removes but ECMA 262's \s does not match, and one the other way round.
PYTHON_ONLY_SPACE = ["\x1c", "\x1d", "\x1e", "\x1f", "\x85"]
ECMA_ONLY_SPACE = "\ufeff"


@pytest.mark.parametrize("space", PYTHON_ONLY_SPACE)
def test_a_text_the_server_trims_to_nothing_is_outside_the_schema(space):
    """A key name (trimmed, not blank) or a judge phrase of only a control character that Python counts as
    whitespace: the server refuses it, so the schema must too (it said ``\\S``, which ECMA 262 reads as "not
    a space" for these)."""
    name = _request_schema("KeyCreateInput")["properties"]["name"]
    rule = _request_schema("JudgeRulesInput")["properties"]["negative_patterns"]
    assert not _valid(name, space) and not _valid(rule, [space])
    api = ApiAs(make_user())
    assert refused(api.post("/api/keys/", {"name": space}), "name")
    assert refused(api.client.put("/api/judge-rules/", {"negative_patterns": [space]}, format="json",
                                  HTTP_X_CSRFTOKEN=api.token))


def test_a_text_the_server_keeps_is_inside_the_schema():
    name = _request_schema("KeyCreateInput")["properties"]["name"]
    rule = _request_schema("JudgeRulesInput")["properties"]["negative_patterns"]
    assert _valid(name, ECMA_ONLY_SPACE) and _valid(rule, [ECMA_ONLY_SPACE])
    api = ApiAs(make_user())
    assert api.post("/api/keys/", {"name": ECMA_ONLY_SPACE}).status_code == 201
    response = api.client.put("/api/judge-rules/", {"negative_patterns": [ECMA_ONLY_SPACE]}, format="json",
                              HTTP_X_CSRFTOKEN=api.token)
    assert response.status_code == 200, response.content


@pytest.mark.parametrize("rules", [
    {"negative_patterns": ["not \x00 that"]},
    {"positive_patterns": [{"pattern": "thanks", "name": "a\x00b"}]},
    {"hint_templates": {"wrong": "Say \x00 it again."}},
])
def test_judge_rules_with_a_nul_are_refused_and_outside_the_schema(rules):
    """PostgreSQL's JSON cannot store NUL: the server refuses it in every rule text and hint, and the schema
    says so, nested as they are (so schemathesis may generate NUL everywhere). A hint's name is refused
    too; OpenAPI 3.0 cannot constrain an object's names, so the schema says that in words."""
    assert not _valid(_request_schema("JudgeRulesInput"), rules)
    api = ApiAs(make_user())
    assert refused(api.client.put("/api/judge-rules/", rules, format="json", HTTP_X_CSRFTOKEN=api.token))
    assert not JudgeRules.objects.exists()


@pytest.mark.parametrize("rule", [
    {"pattern": "thanks", "regex": 0},
    {"pattern": "thanks", "name": 0},
    {"pattern": "thanks", "weight": 2},
])
def test_a_rule_object_takes_its_three_fields_with_their_types(rule):
    """The judge read ``"regex": 0`` as false and a name of 0 as "0", and ignored any other field."""
    assert not _valid(_request_schema("JudgeRulesInput"), {"positive_patterns": [rule]})
    api = ApiAs(make_user())
    assert refused(api.client.put("/api/judge-rules/", {"positive_patterns": [rule]}, format="json",
                                  HTTP_X_CSRFTOKEN=api.token), "positive_patterns")
    rule = {"pattern": "thanks", "name": "thanks", "regex": False}
    assert _valid(_request_schema("JudgeRulesInput"), {"positive_patterns": [rule]})
    assert api.client.put("/api/judge-rules/", {"positive_patterns": [rule]}, format="json",
                          HTTP_X_CSRFTOKEN=api.token).status_code == 200


@pytest.mark.parametrize("query", ["page[x]=1", "page[]=2", "page=1&page=2", "page_size[n]=5",
                                   "page_size=5&page_size=6"])
def test_a_page_given_as_an_object_or_twice_is_refused(query):
    """DRF's paginator never reads ``page[x]`` (it served the first page) and takes the last of repeated
    values; the schema says one integer."""
    response = ApiAs(make_user()).get(f"/api/audit/?{query}")
    assert response.status_code == 400, response.content
    assert response.json()["error"]["data"]["field"] in query


@pytest.mark.parametrize("query", ["offset[x]=1", "limit=1&limit=2"])
def test_a_limit_or_offset_given_as_an_object_or_twice_is_refused(query):
    assert ApiAs(make_user()).get(f"/api/sessions/?{query}").status_code == 400


def test_a_hint_named_with_a_nul_is_refused():
    api = ApiAs(make_user())
    assert refused(api.client.put("/api/judge-rules/", {"hint_templates": {"a\x00b": "Say it again."}},
                                  format="json", HTTP_X_CSRFTOKEN=api.token), "hint_templates")
