import pytest

from clawhub.accounts.services import user_signup
from clawhub.settings import base as base_settings
from tests.factories import PASSWORD


def test_production_hasher_is_argon2():
    # Test settings put MD5 first for speed; every other environment inherits base's list.
    assert base_settings.PASSWORD_HASHERS[0] == "django.contrib.auth.hashers.Argon2PasswordHasher"


@pytest.mark.django_db
def test_passwords_are_stored_as_argon2_hashes_never_in_clear(settings):
    settings.PASSWORD_HASHERS = base_settings.PASSWORD_HASHERS
    user = user_signup(email="h@example.com", password=PASSWORD)
    user.refresh_from_db()
    assert user.password.startswith("argon2$argon2id$")
    assert PASSWORD not in user.password
    assert user.check_password(PASSWORD)
