"""What the OpenAPI document says beyond each view's own annotations, in one place.

- ``ClawHubAutoSchema``: a text field says it refuses NUL characters (``not`` a pattern that finds one); one
  that trims whitespace and may not be blank says so with a pattern (a
  value of only spaces is refused like an empty one); a field's ``style={"openapi": {...}}`` adds what its
  validation (or the service behind it) enforces and drf-spectacular cannot see: a pattern, a narrower enum;
  a serializer's ``Meta.openapi`` does the same for rules across fields (``anyOf``: "a rejection needs a
  reason").
- ``document_errors`` (a post-processing hook): every operation lists the errors it can answer with, each with
  the one error body ``clawhub.core.api.exception_handler`` renders: 400 where it takes input, 401 and 403
  everywhere (no or a bad credential; a role, key scope or CSRF check), 404 where a path names an object or a
  page is asked for, 409 where it changes state, 415 where it reads a body.
- ``add_links`` (a post-processing hook): OpenAPI links from the responses that create or list objects to the
  operations on them, so a client (or a tester) can follow ids instead of guessing them.
"""

from drf_spectacular.openapi import AutoSchema
from rest_framework import serializers

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {"error": {
        "type": "object",
        "required": ["code", "message"],
        "properties": {
            "code": {"type": "string", "description": "Machine-readable: invalid, not_found, conflict, ..."},
            "message": {"type": "string", "description": "For people."},
            "data": {"type": "object", "additionalProperties": True,
                     "description": "field / fields (per-field messages), allowed values, ids, ..."},
        },
    }},
}
_GENERIC = {
    "400": "Invalid input (code invalid, or a more precise one); data.field or data.fields names the fields.",
    "401": "No valid session or API key (not_authenticated, authentication_failed).",
    "403": "The caller may not do this: role, key scope (insufficient_scope) or CSRF (permission_denied).",
    "404": "No such object, or not one the caller may see (not_found); or no such page.",
    "409": "The object's state does not allow this now; the code says why.",
    "415": "The body is not JSON, form or multipart data (unsupported_media_type).",
}
_WRITE = {"post", "put", "patch", "delete"}
NUL = "\\u0000"  # a regular expression (ECMA 262 and Python alike) that finds a NUL character
# A character that Python's str.strip() keeps, which is what DRF's trimming and the services' "is it blank"
# checks use. Spelled out because ``\S`` differs between regex engines (ECMA 262 calls U+001C-U+001F and
# U+0085 text and U+FEFF space; Python the other way round), and a tester generating from the schema would
# disagree with the server.
NOT_SPACE = r"[^\t-\r\x1c-\x20\x85\xa0\u1680\u2000-\u200a\u2028\u2029\u202f\u205f\u3000]"


class ClawHubAutoSchema(AutoSchema):
    def _map_basic_serializer(self, serializer, direction):
        result = super()._map_basic_serializer(serializer, direction)
        meta = getattr(serializer, "Meta", None)
        if direction == "request" and meta is not None:
            result.update(getattr(meta, "openapi", {}))
        return result

    def _map_serializer_field(self, field, direction, bypass_extensions=False):
        result = super()._map_serializer_field(field, direction, bypass_extensions)
        if direction == "request" and isinstance(getattr(field, "style", None), dict):
            result.update(field.style.get("openapi", {}))
        if direction == "request" and isinstance(field, serializers.CharField):
            # DRF refuses NUL characters in every text field (ProhibitNullCharactersValidator).
            result.setdefault("not", {"pattern": NUL})
        if direction == "request" and isinstance(field, serializers.CharField) and not field.allow_blank:
            result.setdefault("minLength", 1)
            if (type(field) in (serializers.CharField, serializers.EmailField) and field.trim_whitespace
                    and "pattern" not in result):
                result["pattern"] = NOT_SPACE  # at least one character that is not whitespace
        return result


def _error_response(description: str) -> dict:
    return {"description": description, "content": {"application/json": {"schema": {
        "$ref": "#/components/schemas/Error"}}}}


def _codes_for(path: str, method: str, operation: dict) -> set[str]:
    params = operation.get("parameters", [])
    codes = {"401", "403"}
    if operation.get("requestBody") or any(p["in"] == "query" for p in params):
        codes.add("400")
    if "{" in path or any(p["in"] == "query" and p["name"] == "page" for p in params):
        codes.add("404")
    if method in _WRITE:
        codes.add("409")
    if operation.get("requestBody"):
        codes.add("415")
    return codes


# A CSV answer (the usage export) is text: its columns are in the response's description.
CSV_SCHEMA = {"type": "string", "description": "CSV with a header line."}


def document_errors(result, generator, request, public):
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for path, operations in result.get("paths", {}).items():
        for method, operation in operations.items():
            body = operation.get("requestBody", {}).get("content", {})
            # The API is JSON (DRF also parses forms, for the browsable pages; a form cannot say null).
            for media_type in [m for m in body if m != "application/json"]:
                del body[media_type]
            responses = operation.setdefault("responses", {})
            csv = any("text/csv" in r.get("content", {}) for r in responses.values())
            for code in _codes_for(path, method, operation) - set(responses):
                responses[code] = _error_response(_GENERIC[code])
            for code, response in responses.items():
                if code[0] in "45" and "content" not in response:
                    response["content"] = _error_response("")["content"]
                if csv and code[0] in "45":
                    response["content"]["text/csv"] = {"schema": CSV_SCHEMA}
                if "text/csv" in response.get("content", {}):
                    response["content"]["text/csv"] = {"schema": CSV_SCHEMA}
    return result


# (operation, status) -> [(target operation, {path parameter: runtime expression})]
_KEY, _GROUP = "$response.body#/key/id", "$response.body#/slug"
LINKS: dict[tuple[str, str], list[tuple[str, dict[str, str]]]] = {
    ("keys_create", "201"): [(op, {"key_id": _KEY}) for op in (
        "keys_retrieve", "keys_partial_update", "keys_rotate_create", "keys_revoke_create",
        "keys_openclaw_retrieve", "me_keys_training_partial_update")],
    ("keys_list", "200"): [("keys_retrieve", {"key_id": "$response.body#/0/id"})],
    ("groups_create", "201"): [(op, {"slug": _GROUP}) for op in (
        "groups_retrieve", "groups_partial_update", "groups_destroy", "groups_members_retrieve",
        "groups_invitations_list", "groups_invitations_create", "groups_keys_list", "groups_leave_create",
        "groups_transfer_create", "groups_judge_rules_retrieve", "groups_judge_rules_update")],
    ("groups_list", "200"): [("groups_retrieve", {"slug": "$response.body#/0/slug"})],
    ("groups_invitations_create", "201"): [
        ("groups_invitations_destroy",
         {"slug": "$request.path.slug", "invitation_id": "$response.body#/id"})],
    ("groups_members_retrieve", "200"): [
        (op, {"slug": "$request.path.slug", "user_id": "$response.body#/members/0/user_id"})
        for op in ("groups_members_partial_update", "groups_members_destroy")],
    ("training_run_start", "201"): [(op, {"run_id": "$response.body#/id"})
                                    for op in ("training_run_detail", "training_run_cancel")],
    ("training_runs_list", "200"): [("training_run_detail", {"run_id": "$response.body#/results/0/id"})],
    ("review_samples_list", "200"): [(op, {"sample_id": "$response.body#/results/0/id"}) for op in (
        "review_samples_retrieve", "review_samples_approve_create", "review_samples_reject_create")],
    ("me_samples_retrieve", "200"): [("me_samples_destroy", {"sample_id": "$response.body#/results/0/id"})],
    ("sessions_list", "200"): [("sessions_retrieve", {"session_id": "$response.body#/results/0/id"})],
    ("adapter_versions_list", "200"): [(op, {"version_id": "$response.body#/results/0/id"})
                                       for op in ("adapter_version_detail", "adapter_version_rollback")],
    ("me_retrieve", "200"): [(op, {"tenant_id": "$response.body#/tenant_id"}) for op in (
        "adapter_versions_list", "training_runs_list", "training_settings_get",
        "review_tenants_policy_retrieve",
        "conversation_settings_get")],
}


def add_links(result, generator, request, public):
    operations = {op["operationId"]: op for ops in result.get("paths", {}).values() for op in ops.values()}
    for (source, status), targets in LINKS.items():
        response = operations.get(source, {}).get("responses", {}).get(status)
        if response is None:
            continue
        for target, parameters in targets:
            if target in operations:
                response.setdefault("links", {})[target] = {"operationId": target, "parameters": parameters}
    return result
