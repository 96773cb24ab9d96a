"""Drives the REST API from its own OpenAPI document with schemathesis, in process (WSGI) on the test
database.

Every operation gets schema-valid (positive) and schema-breaking (negative) requests. Path parameters come
from the caller's own objects half of the time (the rest are generated), so the fuzzer gets past 404 to the
validation behind each operation. Each response is checked, and failures are collected per operation and
check rather than raised at the first, so one run reports everything it found.
"""

import re
from collections import Counter, defaultdict
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import date, timedelta

import schemathesis
from django.core.signals import request_finished, request_started
from django.core.wsgi import get_wsgi_application
from django.db import close_old_connections
from hypothesis import HealthCheck, Phase, given, seed, settings
from hypothesis import strategies as st
from hypothesis.errors import Unsatisfiable
from schemathesis import GenerationMode
from schemathesis.checks import not_a_server_error
from schemathesis.core.failures import FailureGroup
from schemathesis.core.parameters import ParameterLocation
from schemathesis.specs.openapi.checks import (
    content_type_conformance,
    negative_data_rejection,
    positive_data_acceptance,
    response_schema_conformance,
    status_code_conformance,
)

# What every response must satisfy: no 5xx; status, content type and body as the schema documents them.
CHECKS = [not_a_server_error, status_code_conformance, content_type_conformance, response_schema_conformance]
# And by the kind of request: schema-valid ones are not refused as invalid (a schema looser than the server),
# schema-breaking ones are refused (a server looser than the schema).
MODE_CHECKS = {GenerationMode.POSITIVE: [positive_data_acceptance],
               GenerationMode.NEGATIVE: [negative_data_rejection]}
SEED = 18


@dataclass
class Report:
    requests: int = 0
    statuses: Counter = field(default_factory=Counter)
    by_operation: dict[str, Counter] = field(default_factory=lambda: defaultdict(Counter))
    # check name -> how many requests failed it
    counts: Counter = field(default_factory=Counter)
    # check name -> operation label -> first few messages
    failures: dict[str, dict[str, list[str]]] = field(default_factory=lambda: defaultdict(dict))

    def add(self, check: str, operation: str, message: str) -> None:
        self.counts[check] += 1
        found = self.failures[check].setdefault(operation, [])
        message = " ".join(message.split())
        where = re.search(r"Schema at (\S+)", message)
        if where and any(where.group(1) in m for m in found):
            return
        if len(found) < (6 if where else 2):
            found.append(message[:700])

    def operations_failing(self, check: str) -> list[str]:
        return sorted(self.failures.get(check, {}))

    def only_not_found(self) -> list[str]:
        """Operations that never got past 404: the fuzzer never reached what is behind them."""
        return sorted(op for op, statuses in self.by_operation.items() if set(statuses) == {404})

    def totals(self) -> dict[str, int]:
        return {"requests": self.requests,
                "server errors": sum(n for status, n in self.statuses.items() if status >= 500),
                "accepted-invalid": self.counts["negative_data_rejection"],
                "refused-valid": self.counts["positive_data_acceptance"],
                "operations only ever 404": len(self.only_not_found())}

    def summary(self) -> str:
        lines = [", ".join(f"{name}: {n}" for name, n in self.totals().items()),
                 f"{len(self.by_operation)} operations; statuses {dict(sorted(self.statuses.items()))}"]
        lines.extend(f"  only 404: {op}" for op in self.only_not_found())
        for check, ops in sorted(self.failures.items()):
            lines.append(f"{check}: {len(ops)} operation(s)")
            for op, messages in sorted(ops.items()):
                lines.append(f"  {op}")
                lines.extend(f"    - {m}" for m in messages)
        return "\n".join(lines)


@contextmanager
def in_process():
    """Requests served in this process share the test's database connection and transaction, as Django's
    test client does: the WSGI handler must not close the connection at the start or end of a request."""
    request_started.disconnect(close_old_connections)
    request_finished.disconnect(close_old_connections)
    try:
        yield
    finally:
        request_started.connect(close_old_connections)
        request_finished.connect(close_old_connections)


def load_schema():
    schema = schemathesis.openapi.from_wsgi("/api/schema/?format=json", get_wsgi_application())
    return schema


def _order(operation) -> tuple:
    # Reads first, deletions last, so that most operations meet the objects the caller started with; among
    # deletions the deepest path first (a group's members and invitations before the group).
    method = operation.method.upper()
    rank = {"GET": 0, "POST": 1, "PUT": 1, "PATCH": 1, "DELETE": 2}.get(method, 1)
    return (rank, -operation.path.count("/") if rank == 2 else 0, operation.path, method)


def operations(schema) -> list:
    return sorted((result.ok() for result in schema.get_all_operations()), key=_order)


def _usage_range_holds(case) -> bool:
    """The usage operation's rule across parameters, stated in its description: since <= until, at most
    400 days apart (until defaults to today, since to 30 days before until)."""
    try:
        until = date.fromisoformat(case.query["until"]) if "until" in (case.query or {}) else date.today()
        since = (date.fromisoformat(case.query["since"]) if "since" in (case.query or {})
                 else until - timedelta(days=30))
    except (ValueError, OverflowError):
        return True
    return since <= until and (until - since).days <= 400


def _feedback_says_something(case) -> bool:
    """A rating's rule across its fields and the turn's earlier rating, stated in its description: the
    feedback after the change says something. A request that itself says something always keeps to it."""
    body = case.body if isinstance(case.body, dict) else {}
    return (body.get("thumb") not in (None, "") or body.get("score") is not None
            or any(isinstance(body.get(name), str) and body[name].strip()
                   for name in ("comment", "demonstration")))


# Rules across fields (or state) that JSON Schema cannot state; the operation's description states them, and
# positive cases keep to them.
CROSS_FIELD_RULES = {"GET /api/usage/": _usage_range_holds,
                     "POST /api/turns/{turn_id}/feedback/": _feedback_says_something}


def _strategy(operation, mode: GenerationMode, ids: dict[str, list], *, only_own: bool = False):
    generated = operation.as_strategy(generation_mode=mode)
    rule = CROSS_FIELD_RULES.get(operation.label)
    if rule is not None and mode is GenerationMode.POSITIVE:
        generated = generated.filter(rule)
    names = [p.name for p in operation.path_parameters]
    if not names or not all(ids.get(n) for n in names):
        return generated
    own = st.fixed_dictionaries({n: st.sampled_from(ids[n]) for n in names}).flatmap(
        lambda params: operation.as_strategy(generation_mode=mode, path_parameters=params))
    if rule is not None and mode is GenerationMode.POSITIVE:
        own = own.filter(rule)
    return own if only_own else st.one_of(own, generated)


def cross(schema, *, credential, ids: dict[str, list], examples: int, report: Report,
          skip: set[str]) -> Report:
    """Schema-valid requests to every operation that names objects in its path, with another user's ids
    (``ids``) and ``credential``: each must be refused with 403 or 404."""
    for operation in operations(schema):
        names = [p.name for p in operation.path_parameters]
        if not names or operation.label in skip or not all(ids.get(n) for n in names):
            continue
        _fuzz_one(operation, GenerationMode.POSITIVE, credential=credential, ids=ids, examples=examples,
                  report=report, only_own=True, refused=True)
    return report


def fuzz(schema, *, credential, ids: dict[str, list], examples: int, report: Report,
         only: set[str] | None = None) -> Report:
    """``examples`` positive and ``examples`` negative requests per operation (fewer when the schema allows
    fewer distinct ones), with a fixed seed."""
    for operation in operations(schema):
        if only is not None and operation.label not in only:
            continue
        for mode in (GenerationMode.POSITIVE, GenerationMode.NEGATIVE):
            _fuzz_one(operation, mode, credential=credential, ids=ids, examples=examples, report=report)
    return report


def _fuzz_one(operation, mode, *, credential, ids, examples, report, only_own=False, refused=False):
    checks = CHECKS + ([] if refused else MODE_CHECKS[mode])

    @seed(SEED)
    @settings(max_examples=examples, database=None, deadline=None, derandomize=False,
              phases=[Phase.explicit, Phase.generate], suppress_health_check=list(HealthCheck),
              print_blob=False)
    @given(case=_strategy(operation, mode, ids, only_own=only_own))
    def run(case):
        headers = credential.header() if credential is not None else {}
        cookies = _cookies(case, credential)
        response = case.call(headers=headers, cookies=cookies)
        report.requests += 1
        report.statuses[response.status_code] += 1
        report.by_operation[operation.label][response.status_code] += 1
        if refused and response.status_code not in (403, 404):
            report.add("another_users_ids_refused", operation.label,
                       f"{response.status_code} {case.method} {case.formatted_path} -> {response.text[:300]} "
                       f"| body={_short(case.body)}")
        try:
            case.validate_response(response, checks=checks, headers=headers)
        except FailureGroup as group:
            for failure in group.exceptions:
                name = getattr(failure, "title", type(failure).__name__)
                report.add(_check_name(failure, name), operation.label,
                           f"{response.status_code} {case.method} {case.formatted_path} -> "
                           f"{response.text[:300]} | {failure.message[:300]} | query={case.query} "
                           f"body={_short(case.body)}")

    try:
        run()
    except Unsatisfiable:  # nothing in the operation can be made schema-breaking (no body, no parameters)
        pass


def _cookies(case, credential) -> dict[str, str]:
    cookies = credential.cookies() if credential is not None else {}
    if case.meta is not None and case.meta.is_negative_at(ParameterLocation.COOKIE):
        # The case leaves out a cookie the operation requires (the session): the credential's would put it
        # back and make the request valid.
        return {name: value for name, value in cookies.items() if name in (case.cookies or {})}
    return cookies


def _check_name(failure, title: str) -> str:
    names = {
        "ServerError": "not_a_server_error", "UndefinedStatusCode": "status_code_conformance",
        "UndefinedContentType": "content_type_conformance", "MalformedMediaType": "content_type_conformance",
        "JsonSchemaError": "response_schema_conformance", "MalformedJson": "response_schema_conformance",
        "RejectedPositiveData": "positive_data_acceptance", "AcceptedNegativeData": "negative_data_rejection",
    }
    return names.get(type(failure).__name__, type(failure).__name__)


def _short(body) -> str:
    text = repr(body)
    return text if len(text) < 300 else text[:300] + "…"
