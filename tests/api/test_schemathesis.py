"""Property-based test of the REST API from its published OpenAPI document (schemathesis, fixed seed).

As the first user (personal tenant, one group they own, one they administer) and then as a second user,
every operation gets positive and negative generated requests. Checks: no server error, the status code,
content type and body are the ones the schema documents, and no schema-valid request is refused as invalid
(a schema looser than the validation behind it).
"""

import time

from tests.api.fuzz import Report, fuzz, in_process, load_schema

EXAMPLES = 6


def test_generated_requests_meet_the_schema(worlds):
    first, second = worlds
    started = time.monotonic()
    report = Report()
    with in_process():
        schema = load_schema()
        for world in (first, second):
            fuzz(schema, credential=world.credential, ids=world.ids, examples=EXAMPLES, report=report)
    print(f"\nschemathesis: {report.summary()}\n{time.monotonic() - started:.1f} s")
    assert report.requests > 0
    assert not report.failures, report.summary()
