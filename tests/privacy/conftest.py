"""The privacy tests use the review tests' people and samples (a group with an author, a personal user)."""

from tests.review.conftest import api_as, browser_as, pending_sample, team  # noqa: F401
