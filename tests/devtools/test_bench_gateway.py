"""bench_gateway says when its gateway would not run as production's does (no Redis, SQLite)."""

from django.test import override_settings

from clawhub.devtools.management.commands.bench_gateway import unlike_production

POSTGRES = {"default": {"ENGINE": "django.db.backends.postgresql", "NAME": "clawhub"}}
SQLITE = {"default": {"ENGINE": "django.db.backends.sqlite3", "NAME": "x.sqlite3"}}


def test_a_production_like_setup_draws_no_warning():
    with override_settings(REDIS_URL="redis://127.0.0.1:6379/0", DATABASES=POSTGRES):
        assert unlike_production() == []


def test_without_redis_or_postgres_the_run_says_so():
    with override_settings(REDIS_URL="", DATABASES=SQLITE):
        lines = unlike_production()
    assert len(lines) == 2
    assert lines[0].startswith("REDIS_URL is not set") and "SQLite" in lines[1]
