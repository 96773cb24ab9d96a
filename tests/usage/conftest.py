# The record builders and the ``key`` fixture are shared with the conversations tests.
from tests.conversations.conftest import key  # noqa: F401
