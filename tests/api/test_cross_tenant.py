"""No tenant data crosses: every operation that names an object in its path, called by a second user with the
first user's ids (schema-valid requests otherwise, fixed seed), is refused with 403 or 404."""

from tests.api.fuzz import Report, cross, in_process, load_schema

EXAMPLES = 4
# An invitation link's token is the invitation itself (whoever holds it may open and accept it, once): it is
# not another user's data.
BEARER_TOKENS = {"GET /api/invitations/{token}/", "POST /api/invitations/{token}/accept/",
                 "POST /api/invitations/{token}/decline/"}


def test_a_second_users_requests_for_the_first_users_objects_are_refused(worlds):
    first, second = worlds
    report = Report()
    with in_process():
        cross(load_schema(), credential=second.credential, ids=first.ids, examples=EXAMPLES, report=report,
              skip=BEARER_TOKENS)
    print(f"\ncross-tenant: {report.summary()}")
    assert report.requests >= 100
    assert set(report.statuses) <= {403, 404}, report.summary()
    assert not report.failures, report.summary()
