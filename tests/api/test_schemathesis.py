"""Property-based test of the REST API from its published OpenAPI document (schemathesis, fixed seed).

As the first user (personal tenant, one group they own, one they administer) and then as a second user, each
with an API key holding every scope, every operation gets positive and negative generated requests, with the
caller's real ids in the path half of the time; the operations only a session may call get them again with a
signed-in session. Checks: no server error; the status code, content type and body are the ones the schema
documents; no schema-valid request is refused as invalid (a schema looser than the server) and no
schema-breaking one is accepted (a server looser than the schema); every operation gets past 404 at least
once (the ids reach what is behind it).
"""

import time

from django.urls import resolve

from clawhub.keys.scopes import REST_RULES, SESSION
from tests.api.fuzz import Report, fuzz, in_process, load_schema

EXAMPLES = 6


def _session_only(schema) -> set[str]:
    """The operations no API key may call, whatever it holds (rule SESSION): they get a pass with a signed-in
    session. None of them has path parameters."""
    labels = set()
    for result in schema.get_all_operations():
        operation = result.ok()
        if "{" in operation.path:
            continue
        match = resolve(operation.path)
        if REST_RULES.get(match.url_name, {}).get(operation.method.upper()) == SESSION:
            labels.add(operation.label)
    return labels


def test_generated_requests_meet_the_schema(worlds):
    """Over a minute (95 s in a two-worker run): every operation, with a key of each of two users and a
    session, EXAMPLES generated requests each, through the real Django stack."""
    first, second = worlds
    started = time.monotonic()
    report = Report()
    with in_process():
        schema = load_schema()
        for world in (first, second):
            fuzz(schema, credential=world.credential, ids=world.ids, examples=EXAMPLES, report=report)
        session_only = _session_only(schema)
        fuzz(schema, credential=first.session, ids=first.ids, examples=EXAMPLES, report=report,
             only=session_only)
    print(f"\nschemathesis: {report.summary()}\n{time.monotonic() - started:.1f} s")
    assert report.requests > 0
    assert len(session_only) >= 4, session_only
    assert not report.failures, report.summary()
    # Operations that only ever got 404 are printed, not failed: the full run at 5d77850 had one
    # (POST /api/groups/{slug}/transfer/, its groups already deleted: the order of operations varies between
    # runs). Making every id-taking operation run before the deletions is still to do.
