"""The OpenAPI schema builds cleanly (`manage.py spectacular --validate --fail-on-warn`) and documents the API

drf-spectacular reports an undocumented view ("unable to guess serializer") or a clash ("operationId ... has
collisions") as a warning and carries on, leaving the view out or renaming the operation. These tests turn
such warnings into failures that name the file or path they come from, so its owner knows to annotate it.
"""

import os
import re
import subprocess
import sys
from collections import defaultdict
from importlib import import_module
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parents[1]
# The apps whose views are fully annotated today; a warning from any of them is a regression.
ANNOTATED = ("clawhub/accounts/", "clawhub/groups/", "clawhub/keys/")


def _schema_paths(app: str) -> set[str]:
    """The schema paths an app's api_urls serves (other apps add paths under the same prefixes, /api/me/…)."""
    patterns = import_module(f"clawhub.{app}.api_urls").urlpatterns
    return {"/api/" + re.sub(r"<(?:\w+:)?(\w+)>", r"{\1}", str(p.pattern)) for p in patterns}


ACCOUNTS_PATHS, GROUPS_PATHS, KEYS_PATHS = (_schema_paths(app) for app in ("accounts", "groups", "keys"))


def _spectacular(*args: str) -> subprocess.CompletedProcess:
    # The caller's DATABASE_URL / REDIS_URL / CELERY_BROKER_URL pass through, so each engineer's own databases
    # are used; the schema itself needs neither, but settings and app loading read them.
    env = {**os.environ, "DJANGO_SETTINGS_MODULE": "clawhub.settings.test"}
    return subprocess.run([sys.executable, "manage.py", "spectacular", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=180)


def _warnings(output: str) -> list[str]:
    """The warning and error lines drf-spectacular printed, without the summary."""
    return [line.strip() for line in output.splitlines()
            if re.search(r"\b(Warning|Error)\b", line) and not line.startswith(("Warnings:", "Errors:"))]


def _source(line: str) -> str:
    """Where a warning comes from: its file, else the API paths it names, else 'unknown'."""
    if match := re.search(r"(clawhub/[\w/]+\.py)", line):
        return match.group(1)
    if paths := sorted(set(re.findall(r"'(/api/[^']*)'", line))):
        return "paths " + ", ".join(paths)
    return "unknown"


def _is_ours(source: str) -> bool:
    named = source.removeprefix("paths ").split(", ")
    return source.startswith(ANNOTATED) or bool(set(named) & (ACCOUNTS_PATHS | GROUPS_PATHS | KEYS_PATHS))


def _report(lines: list[str]) -> str:
    by_source: dict[str, list[str]] = defaultdict(list)
    for line in lines:
        by_source[_source(line)].append(line)
    parts = [f"drf-spectacular warned about {len(by_source)} source(s); annotate their views with "
             f"@extend_schema (see clawhub/keys/api.py):"]
    for source, found in sorted(by_source.items()):
        parts.append(f"\n  {source}:")
        # The first sentence says what and where; the rest is drf-spectacular's boilerplate advice.
        parts.extend(f"    - {line.split('. ')[0][:240]}" for line in sorted(set(found)))
    return "\n".join(parts)


@pytest.fixture(scope="module")
def strict_run(tmp_path_factory):
    """`manage.py spectacular --validate --fail-on-warn --file <tmp>`: its result and where it wrote."""
    target = tmp_path_factory.mktemp("openapi") / "schema.yaml"
    result = _spectacular("--validate", "--fail-on-warn", "--file", str(target))
    return result, target


@pytest.fixture(scope="module")
def schema(strict_run, tmp_path_factory) -> dict:
    """The generated schema. --fail-on-warn writes nothing when another app warns, so then it is generated
    again without that flag: the checks of what the schema documents do not depend on other apps' warnings."""
    result, target = strict_run
    if result.returncode != 0:
        target = tmp_path_factory.mktemp("openapi-lenient") / "schema.yaml"
        result = _spectacular("--validate", "--file", str(target))
        assert result.returncode == 0, f"The schema does not validate:\n{result.stderr[-4000:]}"
    return yaml.safe_load(target.read_text())


def test_schema_builds_and_validates_without_any_warning(strict_run):
    result, _target = strict_run
    warnings = _warnings(result.stderr + result.stdout)
    # No warning but a failure means the schema did not validate, or the command crashed: show its end.
    assert result.returncode == 0, _report(warnings) if warnings else result.stderr[-3000:]


def test_accounts_groups_and_keys_add_no_warning(strict_run):
    # Separate from the strict test so a regression here is visible even while another app still warns.
    result, _target = strict_run
    ours = [line for line in _warnings(result.stderr + result.stdout) if _is_ours(_source(line))]
    assert not ours, _report(ours)


def _json_body(operation: dict) -> dict:
    return operation["requestBody"]["content"]["application/json"]["schema"]


def _component(schema: dict, ref: dict) -> dict:
    return schema["components"]["schemas"][ref["$ref"].rsplit("/", 1)[1]]


def test_core_paths_are_documented_with_their_request_bodies(schema):
    paths = schema["paths"]
    for path in ("/api/auth/signup/", "/api/groups/", "/api/keys/"):
        assert path in paths, f"{path} is missing from the schema"

    signup = paths["/api/auth/signup/"]["post"]
    assert signup["requestBody"]["required"] is True
    signup_input = _component(schema, _json_body(signup))
    assert {"email", "password", "display_name"} <= set(signup_input["properties"])
    assert set(signup_input["required"]) == {"email", "password"}
    signup_output = _component(schema, signup["responses"]["201"]["content"]["application/json"]["schema"])
    assert set(signup_output["properties"]) == {"user", "logged_in", "email_verification_required",
                                                "csrf_token"}

    create_group = paths["/api/groups/"]["post"]
    group_input = _component(schema, _json_body(create_group))
    assert set(group_input["properties"]) == {"name", "slug"}
    assert group_input["required"] == ["name"]
    assert "201" in create_group["responses"]

    assert "post" in paths["/api/keys/"] and "requestBody" in paths["/api/keys/"]["post"]


def test_group_list_and_detail_have_their_own_operation_ids(schema):
    assert schema["paths"]["/api/groups/"]["get"]["operationId"] == "groups_list"
    assert schema["paths"]["/api/groups/{slug}/"]["get"]["operationId"] == "groups_retrieve"
    # A numeral suffix ("groups_retrieve_2") is how drf-spectacular resolves a collision it warned about.
    ours = ACCOUNTS_PATHS | GROUPS_PATHS | KEYS_PATHS
    suffixed = [op["operationId"] for path, ops in schema["paths"].items() if path in ours
                for op in ops.values() if re.search(r"_\d+$", op["operationId"])]
    assert not suffixed


@pytest.mark.parametrize("paths, tag", [(ACCOUNTS_PATHS, "accounts"), (GROUPS_PATHS, "groups")],
                         ids=["accounts", "groups"])
def test_every_accounts_and_groups_operation_is_tagged_and_has_a_success_response(schema, paths, tag):
    # An APIView drf-spectacular cannot describe is left out of the schema altogether.
    assert paths <= set(schema["paths"]), sorted(paths - set(schema["paths"]))
    for path in paths:
        for method, op in schema["paths"][path].items():
            assert op["tags"] == [tag], (method, path, op["tags"])
            assert any(code.startswith("2") for code in op["responses"]), (method, path, op["responses"])


def test_a_rating_says_its_thumb_and_score_must_agree_and_that_stored_feedback_may_conflict(schema):
    """A schema-valid rating must not be refused as invalid: the schema carries the rule across fields that
    the service enforces (up with 1-2, down with 4-5), and a disagreement with stored feedback is a 409."""
    import jsonschema

    rate = schema["paths"]["/api/turns/{turn_id}/feedback/"]["post"]
    body = _component(schema, _json_body(rate))
    assert "409" in rate["responses"]
    check = jsonschema.Draft4Validator({"not": body["not"]})  # the rule alone (OpenAPI's nullable aside)
    assert not check.is_valid({"thumb": "down", "score": 4})
    assert not check.is_valid({"thumb": "up", "score": 2})
    assert all(check.is_valid(b) for b in ({"thumb": "down", "score": 3}, {"thumb": "up", "score": 5},
                                            {"thumb": "down", "score": None}, {"score": 1}, {"thumb": "up"}))
