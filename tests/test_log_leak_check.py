"""The suite-wide key-material check in tests/conftest.py catches a leaked key (and only real ones)."""

import logging

from tests.conftest import _KeyMaterialCatcher
from tests.factories import make_key


def test_the_catcher_flags_a_logged_secret_and_ignores_masked_ones(db):
    catcher = _KeyMaterialCatcher()
    logger = logging.getLogger("clawhub.test.leak")
    logger.addHandler(catcher)
    try:
        _, secret = make_key()
        logger.warning("key %s was used", "chk_[REDACTED]")
        logger.warning("Authorization: Bearer chk_[REDACTED]")
        assert catcher.leaks == []
        logger.warning("key %s was used", secret)
        assert len(catcher.leaks) == 1 and "clawhub.test.leak" in catcher.leaks[0]
    finally:
        logger.removeHandler(catcher)
