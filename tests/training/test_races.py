"""Race tests with real Celery train workers on real Redis and PostgreSQL: a kick while a promotion is
queued, a worker killed between "succeeded" and "promote sent", a promotion that fails on one of two
upstreams, and a batch that keeps timing out. After each, every approved sample of the tenant is in exactly
one promoted version's lineage, held out, or waiting with a reason (sample_standing never says "lost")."""

import json
import threading
import time
from collections import Counter
from datetime import timedelta
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from django.conf import settings as django_settings
from django.utils import timezone

from clawhub.adapters import services as adapter_services
from clawhub.adapters.models import AdapterVersion, LoadedAdapter
from clawhub.training import lineage_services, services
from clawhub.training.models import TrainingRun, TrainingSettings
from clawhub.training.selectors import sample_standing, samples_held_back
from tests.factories import make_user
from tests.gateway.conftest import start_fake
from tests.training.conftest import approved_samples
from tests.training.test_worker_kill import (
    VISIBILITY_TIMEOUT,
    purge_train_queue,
    start_worker,
    stop,
    wait_for,
)

pytestmark = [pytest.mark.worker, pytest.mark.django_db(transaction=True)]

State = AdapterVersion.State
FAST = {"micro_batch_size": 2, "max_seq_len": 256, "lr": 1e-3, "lora_r": 4, "lora_alpha": 8}


@pytest.fixture(autouse=True)
def empty_train_queue():
    purge_train_queue()
    yield
    purge_train_queue()


@pytest.fixture
def upstream():
    fake = start_fake(FAKE_LOAD_DELAY="0.01")
    yield fake
    fake.stop()


class Refusing:
    """An upstream that answers /health but refuses to load adapters until told otherwise."""

    def __init__(self):
        self.refuse = True
        self.loaded: set[str] = set()
        outer = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args):
                pass

            def _answer(self, status, body=b"{}"):
                self.send_response(status)
                self.send_header("content-length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def do_GET(self):
                self._answer(200)

            def do_POST(self):
                body = self.rfile.read(int(self.headers["content-length"]))
                name = json.loads(body or b"{}").get("lora_name")
                if self.path == "/v1/load_lora_adapter":
                    if outer.refuse:
                        return self._answer(500, b'{"error": {"message": "out of GPU memory"}}')
                    outer.loaded.add(name)
                elif self.path == "/v1/unload_lora_adapter":
                    outer.loaded.discard(name)
                self._answer(200)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_port}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def stop(self):
        self.server.shutdown()


def upstreams(*urls) -> str:
    return json.dumps([{"url": url, "base_model": "tiny"} for url in urls])


def tenant_with_settings(settings, tmp_path):
    settings.CLAWHUB_TRAIN_WORKDIR = str(tmp_path / "train")
    settings.CLAWHUB_ADAPTER_DIR = str(tmp_path / "adapters")
    settings.CLAWHUB_TRAINING_BATCH_SIZE = 4
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 4
    user = make_user()
    TrainingSettings.objects.create(tenant=user.tenant, method="rl", overrides=FAST)
    return user


def batch(user):
    return approved_samples(user, 2, reward=1) + approved_samples(user, 2, reward=-1)


def version_of(run_id: int) -> AdapterVersion | None:
    return TrainingRun.objects.get(pk=run_id).adapter_version


def assert_lineage_complete(tenant, *, versions: int) -> dict[int, str]:
    """Every approved sample: trained into exactly one version of the active lineage, or held out."""
    standing = sample_standing(tenant=tenant)
    assert "lost" not in standing.values(), standing
    counts = Counter(standing.values())
    assert counts["held out: the eval gate's held-out slice"] == versions
    assert sorted(k for k in counts if k.startswith("in ")) == [f"in v{n}" for n in range(1, versions + 1)]
    assert all(counts[f"in v{n}"] == 3 for n in range(1, versions + 1)), counts
    return standing


def worker_env(**extra) -> dict[str, str]:
    return {
        "CLAWHUB_TRAINING_BATCH_SIZE": "4",
        "CLAWHUB_GATE_HOLDOUT_EVERY": "4",
        "CLAWHUB_PROMOTE_RETRY_BACKOFF": "0.2",
        "CLAWHUB_ADAPTER_DRAIN_SECONDS": "1",
        **extra,
    }


def test_a_kick_while_the_promotion_is_queued_waits_and_the_next_version_continues_it(
    tmp_path, settings, upstream
):
    user = tenant_with_settings(settings, tmp_path)
    batch(user)
    # Slow pre-loads keep v1's promotion in flight long enough for the kick to land in the middle of it.
    slow = start_fake(FAKE_LOAD_DELAY="3")
    worker = start_worker(tmp_path, **worker_env(CLAWHUB_UPSTREAMS=upstreams(slow.url)))
    try:
        [first] = services.runs_kick()
        v1 = wait_for(lambda: version_of(first), 120, "no v1")
        wait_for(lambda: TrainingRun.objects.get(pk=first).state == TrainingRun.State.SUCCEEDED, 120, "run 1")
        batch(user)
        before = AdapterVersion.objects.get(pk=v1.pk).state
        assert services.runs_kick() == []  # queued behind v1
        after = AdapterVersion.objects.get(pk=v1.pk).state
        assert before in (State.CANDIDATE, State.EVALUATING) and after in (State.CANDIDATE, State.EVALUATING)
        # The promote task kicks the tenant once v1 is active: run 2 trains from v1 without another kick.
        v2 = wait_for(
            lambda: AdapterVersion.objects.filter(tenant=user.tenant, version=2, state=State.ACTIVE).first(),
            240,
            "v2 was not promoted",
        )
    finally:
        stop(worker)
        slow.stop()
    v1.refresh_from_db()
    second = TrainingRun.objects.get(adapter_version=v2)
    assert v2.parent_id == v1.pk and second.parent_resolved_at >= v1.promoted_at
    assert v1.state == State.RETIRED
    assert v2.metrics["optimizer_resumed_at"] == 1  # and it continued v1's optimizer
    assert_lineage_complete(user.tenant, versions=2)


def test_a_worker_killed_between_succeeded_and_promote_sent_still_promotes(tmp_path, settings, upstream):
    """About a minute (70 s in a two-worker run): a real worker trains, dies after marking the run succeeded,
    and the promotion is redriven by the sweep through a second real worker."""
    user = tenant_with_settings(settings, tmp_path)
    batch(user)
    env = worker_env(CLAWHUB_UPSTREAMS=upstreams(upstream.url))
    worker = start_worker(tmp_path, CLAWHUB_TEST_DIE_AFTER_SUCCEED="1", **env)
    try:
        [run_id] = services.runs_kick()
        worker.wait(timeout=180)  # it dies by itself, right after committing "succeeded"
    finally:
        stop(worker)
    run = TrainingRun.objects.get(pk=run_id)
    assert run.state == TrainingRun.State.SUCCEEDED
    assert run.adapter_version.state == State.CANDIDATE and run.adapter_version.evaluating_since is None
    standing = sample_standing(tenant=user.tenant)
    assert list(standing.values()).count("waiting: v1 being evaluated and promoted") == 3

    time.sleep(VISIBILITY_TIMEOUT + 1)  # the unacknowledged train task is delivered again
    worker = start_worker(tmp_path, **env)
    try:
        wait_for(lambda: version_of(run_id).state == State.ACTIVE, 180, "v1 was not promoted")
    finally:
        stop(worker)
    assert_lineage_complete(user.tenant, versions=1)


def test_a_promotion_that_fails_on_one_of_two_upstreams_leaves_no_preload_and_is_redriven(
    tmp_path, settings, upstream
):
    user = tenant_with_settings(settings, tmp_path)
    refusing = Refusing()
    settings.CLAWHUB_UPSTREAMS = [{"url": upstream.url, "base_model": "tiny"}, {"url": refusing.url}]
    batch(user)
    env = worker_env(CLAWHUB_UPSTREAMS=upstreams(upstream.url, refusing.url), CLAWHUB_PROMOTE_RETRIES="1")
    worker = start_worker(tmp_path, **env)
    try:
        [run_id] = services.runs_kick()
        wait_for(lambda: (v := version_of(run_id)) and v.promotion_error, 180, "no promotion failure")
        v1 = version_of(run_id)
        # The upstream's error body is recorded by its shape only (it may echo what was sent).
        assert v1.state == State.CANDIDATE and "refused to load" in v1.promotion_error
        assert "500" in v1.promotion_error
        # The upstream that did load it was cleaned: nothing serves or holds a version that is not active.
        assert v1.upstream_name not in upstream.stats()["adapters"]
        assert not LoadedAdapter.objects.filter(adapter_name=v1.upstream_name).exists()
        standing = sample_standing(tenant=user.tenant)
        assert list(standing.values()).count("waiting: v1 being evaluated and promoted") == 3

        refusing.refuse = False
        later = timezone.now() + timedelta(seconds=django_settings.CLAWHUB_PROMOTION_STUCK_SECONDS + 1)
        assert lineage_services.promotions_sweep(now=later)["redriven"] == [v1.upstream_name]
        wait_for(lambda: version_of(run_id).state == State.ACTIVE, 180, "the re-driven promotion")
    finally:
        stop(worker)
        refusing.stop()
    assert v1.upstream_name in upstream.stats()["adapters"] and v1.upstream_name in refusing.loaded
    assert_lineage_complete(user.tenant, versions=1)


def test_a_batch_that_keeps_timing_out_stops_being_claimed_and_waits_with_a_reason(tmp_path, settings):
    """About a minute (64 s in a two-worker run): real workers hit the run's time limit twice before the
    batch stops being claimed."""
    user = tenant_with_settings(settings, tmp_path)
    settings.CLAWHUB_TRAIN_MAX_TIMEOUTS = 2
    # A run that times out every time: more epochs than a tenant may ask for, which the operator allows.
    bounds = {"epochs": 50}
    settings.CLAWHUB_TRAIN_UPPER_BOUNDS = bounds
    TrainingSettings.objects.filter(tenant=user.tenant).update(overrides={**FAST, "epochs": 50})
    claimed = batch(user)
    # --pool solo, as production's train workers run: Celery cannot interrupt a task there, so the time-out
    # comes from the run's own deadline, checked between optimizer steps.
    worker = start_worker(
        tmp_path,
        step_delay=1.0,
        pool="solo",
        CLAWHUB_TRAIN_SOFT_TIME_LIMIT="15",
        CLAWHUB_TRAIN_TIME_LIMIT="60",
        CLAWHUB_TRAIN_UPPER_BOUNDS=json.dumps(bounds),
    )
    try:
        for attempt in range(2):
            [run_id] = services.runs_kick()
            wait_for(
                lambda r=run_id: TrainingRun.objects.get(pk=r).state == TrainingRun.State.FAILED,
                120,
                f"run {attempt + 1} did not time out",
            )
            assert TrainingRun.objects.get(pk=run_id).failure == TrainingRun.Failure.TIMEOUT
        assert services.runs_kick() == []  # the third claim does not happen
    finally:
        stop(worker)
    held = samples_held_back(tenant=user.tenant)
    assert len(held) == 3 and all("timed out 2 times" in why for why in held.values())
    standing = sample_standing(tenant=user.tenant)
    assert "lost" not in standing.values()
    assert {standing[s.pk] for s in claimed} >= {f"waiting: {why}" for why in held.values()}
    assert not AdapterVersion.objects.filter(tenant=user.tenant).exists()


def test_a_rollback_made_on_another_worker_while_the_gate_runs_wins(tmp_path, settings):
    """Two real train workers. Worker A takes v3's promotion and sits in its gate (a test gate that waits to
    be released); meanwhile the owner rolls back to v1, which worker B carries out. When A's gate passes, its
    switch re-reads the lineage under the tenant's lock: v1 stays active and v3, which continues v2, is
    rejected (before the fix, A activated v3 and silently overrode the rollback). About 40 s, most of it the
    two workers importing torch."""
    from clawhub.tenants.access import tenant_access
    from tests.adapters.conftest import make_version

    user = make_user()
    v1 = make_version(user.tenant, 1, State.RETIRED)
    v2 = make_version(user.tenant, 2, State.ACTIVE, parent=v1)
    v3 = make_version(user.tenant, 3, parent=v2)
    release = tmp_path / "release-gate"
    env = worker_env(CLAWHUB_TEST_GATE_RELEASE=str(release))
    workers = [start_worker(tmp_path / name, **env) for name in ("a", "b")]
    try:
        from workers.celery import app

        app.send_task("clawhub.train.promote", args=[v3.pk])
        # Two workers importing torch on two busy cores: 48 s in CI, over 120 s in a run beside benchmarks.
        wait_for(lambda: AdapterVersion.objects.get(pk=v3.pk).state == State.EVALUATING, 300, "no gate")
        adapter_services.adapter_rollback(access=tenant_access(actor=user, tenant_id=user.tenant.pk),
                                          version=v1)
        # Worker B may still be importing torch (A got there first): the same bound as A's start.
        wait_for(lambda: AdapterVersion.objects.get(pk=v1.pk).state == State.ACTIVE, 300, "no rollback")
        release.touch()
        wait_for(lambda: AdapterVersion.objects.get(pk=v3.pk).state not in (State.EVALUATING,), 120,
                 "the gate did not end")
    finally:
        for worker in workers:
            stop(worker)
    states = dict(AdapterVersion.objects.filter(tenant=user.tenant).values_list("version", "state"))
    assert states == {1: State.ACTIVE, 2: State.RETIRED, 3: State.REJECTED}, states
    v3.refresh_from_db()
    assert v3.decision == "stale_parent" and "(v1 is active)" in v3.decision_reason
