"""The benchmark driver. Its pure parts (review decisions, summaries, the adversary's shift), and one whole
update per tenant driven in-process: the driver's HTTP calls go to the real Django app (httpx's WSGI
transport), its /v1 calls to a stand-in gateway that captures and judges like the real one (rule judge with
the bench's rules, the review app's own sample creation and guards), and the "worker" trains on the first
poll."""

import json
import re

import httpx
import pytest
from django.core import signals
from django.core.handlers.wsgi import WSGIHandler
from django.db import close_old_connections

from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.services import adapter_version_create
from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.client import tenant_ids_from_html
from clawhub.devtools.personas.config import BenchConfig
from clawhub.devtools.personas.driver import Bench
from clawhub.devtools.personas.reviewer import review_decisions
from clawhub.devtools.personas.tracks import Track, UpdateRecord, adversary_shift, agreement
from clawhub.feedback.models import JudgeRules
from clawhub.keys.selectors import key_resolve
from clawhub.review.models import ReviewPolicy, Sample
from clawhub.review.services import sample_create_for_judgment
from clawhub.training import services as training_services
from clawhub.training.models import TrainingRun, TrainingSettings
from tests.factories import make_group, make_user
from tests.personas.conftest import BRIEF, HABIT, judge_next_state
from tests.review.conftest import make_judgment, make_turn
from workers.trainer import capability as C

# --- pure parts ---------------------------------------------------------------------------------------------


def sample(sid, *codes, state="pending"):
    return {"id": sid, "state": state, "flags": [{"code": c, "detail": ""} for c in codes]}


def test_review_approves_what_only_the_new_key_guard_held_and_rejects_group_outliers():
    samples = [sample(1, "new_key"), sample(2), sample(3, "new_key", "member_outlier"),
               sample(4, "near_duplicate"), sample(5, "new_key", state="approved"), sample(6, "split_votes")]
    assert review_decisions(samples, group=False) == ([1, 2, 6], [])  # a personal tenant has no outliers
    assert review_decisions(samples, group=True) == ([1, 2, 6], [3])  # near duplicates wait for a human


def record(update, compliance, sessions, served=None, outcome="active"):
    return UpdateRecord(update=update, attempt=update, run_id=update, version=update, outcome=outcome,
                        compliance=compliance, sessions=sessions, samples=16, feedback_to_served_s=served,
                        oldest_feedback_to_served_s=None, run_to_served_s=None)


def test_a_tracks_summary_counts_updates_and_sessions_to_the_target():
    track = Track(name="brief", persona=P.BRIEF, members=[], model="clawhub-personal", tenant_id=7)
    track.base_compliance = 0.25
    track.records = [record(1, 0.5, 6, 30.0), record(1, None, 12, outcome="rejected"),
                     record(2, 0.85, 18, 50.0), record(3, 0.9, 24, 40.0)]
    track.attempts, track.sessions = 4, 24
    summary = track.summary(0.8)
    assert summary["compliance"] == [0.25, 0.5, 0.85, 0.9]
    assert (summary["updates_to_target"], summary["sessions_to_target"]) == (2, 18)
    counts = summary["updates_promoted"], summary["updates_attempted"], summary["updates_rejected"]
    assert counts == (3, 4, 1)
    assert summary["feedback_to_served_median_s"] == 40.0
    track.base_compliance = 0.9
    assert track.summary(0.8)["updates_to_target"] == 0 and track.summary(0.8)["sessions_to_target"] == 0
    assert track.summary(0.95)["updates_to_target"] is None


def test_the_adversarys_shift_is_the_control_minus_the_attacked_group():
    shift = adversary_shift([0.25, 0.5, 0.6], [0.25, 0.625, 0.75, 0.875])
    assert shift == {"per_update": [0.0, 0.125, 0.15], "final": 0.15, "max_abs": 0.15}
    assert adversary_shift([None], [0.5])["final"] is None


def test_config_refuses_unknown_methods_personas_and_judges():
    with pytest.raises(ValueError, match="unknown methods"):
        BenchConfig(methods=("ppo",))
    with pytest.raises(ValueError, match="unknown personas"):
        BenchConfig(personas=("ta",))
    with pytest.raises(ValueError, match="judge"):
        BenchConfig(judge="gpt")
    with pytest.raises(ValueError, match="phrasings"):
        BenchConfig(phrasings="all")


def test_judge_agreement_counts_what_was_read_against_what_the_users_meant():
    truth = {"thanks a": True, "too long b": False, "too long c": False, "nice d": True, "noisy e": True}
    read = {"thanks a": 1, "too long b": -1, "too long c": 1, "noisy e": -1, "unknown": 1}
    found = agreement(truth, read)
    assert (found["reactions"], found["judged"], found["coverage"], found["agreement"]) == (5, 4, 0.8, 0.5)
    assert (found["pleased_read_positive"], found["displeased_read_negative"]) == (1, 1)
    assert agreement({}, {})["agreement"] is None


@pytest.mark.django_db
def test_tenant_ids_are_read_from_the_training_page(client):
    user = make_user()
    group = make_group(user)
    client.force_login(user)
    html = client.get("/training/").content.decode()
    assert tenant_ids_from_html(html) == {f"personal: {user.email}": user.tenant.pk,
                                          f"group {group.slug}": group.tenant.pk}


@pytest.mark.django_db
def test_the_bench_judge_rules_are_accepted_by_the_api(api_client):
    user = make_user()
    api_client.force_login(user)
    token = api_client.get("/api/auth/csrf/").json()["csrf_token"]
    body = dict(P.JUDGE_RULES, judge="rule")
    response = api_client.put("/api/judge-rules/", body, format="json", HTTP_X_CSRFTOKEN=token)
    assert response.status_code == 200, response.content
    assert response.json()["negative_patterns"] == P.JUDGE_RULES["negative_patterns"]


# --- one update per tenant, in-process ----------------------------------------------------------------------


class Message:
    def __init__(self, content):
        self.content = content


class Reply:
    def __init__(self, content):
        self.choices = [type("Choice", (), {"message": Message(content), "finish_reason": "stop"})()]


def about(reply: str, question: str) -> str:
    """``reply`` (a water-cycle answer) made about the topic ``question`` names: an answer that names no topic
    is an evasion to the users and the rubric."""
    topic = next((t for t in (*P.TRAINING_TOPICS, *P.HELD_OUT_TOPICS) if t in question), "the water cycle")
    return reply.replace("The water cycle", topic[0].upper() + topic[1:])


class FakeGateway:
    """What /v1 does for the bench, in-process: serves the tenant's model (formatted answers from the base
    model, plain ones once an adapter version is active), and captures each main turn's previous reply with
    the newest user message as its next state, judged by the rule judge and turned into a sample by review."""

    def __init__(self, secret: str, log: list):
        self.secret, self.log = secret, log
        self.chat = type("Chat", (), {"completions": self})()

    def create(self, *, model, messages, max_tokens, seed, extra_headers, temperature=None):
        resolved = key_resolve(secret=self.secret)
        self.log.append({"model": model, "headers": dict(extra_headers), "temperature": temperature,
                         "messages": len(messages), "tenant": resolved.tenant.pk})
        assert model == resolved.tenant.model_id
        side = extra_headers.get("X-Turn-Type") == "side"
        if not side and len(messages) >= 3:
            turn = make_turn(resolved.user, key=resolved.key, tenant=resolved.tenant,
                             prompt=messages[-3]["content"], reply=messages[-2]["content"],
                             next_text=messages[-1]["content"])
            verdict = judge_next_state(messages[-1]["content"])
            sample_create_for_judgment(judgment_id=make_judgment(turn, reward=verdict.reward,
                                                                 hints=verdict.hints).pk)
        active = AdapterVersion.objects.filter(tenant=resolved.tenant, state=AdapterVersion.State.ACTIVE)
        question = messages[-1]["content"]
        if question.endswith(C.INSTRUCTION):  # the capability guard: the base knows, the adapter forgot one
            answers = [a[0] for q, a in C.QUESTIONS if question.startswith(q)]
            forgot = active.exists() and "Tokyo" in answers
            return Reply(answers[0] if answers and not forgot else "No idea.")
        if messages[0]["role"] == "system":  # the prompt-only baseline: half of the base's replies comply
            return Reply(about(BRIEF if len(self.log) % 2 else HABIT, question))
        return Reply(about(BRIEF if active.exists() else HABIT, question))


class WorkerOnPoll(httpx.BaseTransport):
    """The Django app over WSGI; a poll of a queued run first does what the train and promote tasks would."""

    def __init__(self):
        self.app = httpx.WSGITransport(app=WSGIHandler())
        self.trained: list[int] = []

    def handle_request(self, request):
        match = re.fullmatch(r"/api/training/runs/(\d+)/", request.url.path)
        if match and request.method == "GET":
            self.train(int(match.group(1)))
        # Like Django's test client: a request must not close the test's connection (and its transaction).
        signals.request_started.disconnect(close_old_connections)
        signals.request_finished.disconnect(close_old_connections)
        try:
            response = self.app.handle_request(request)
            response.read()
            return response
        finally:
            signals.request_started.connect(close_old_connections)
            signals.request_finished.connect(close_old_connections)

    def train(self, run_id: int) -> None:
        run = TrainingRun.objects.get(pk=run_id)
        if run.state != TrainingRun.State.QUEUED:
            return
        training_services.run_mark_running(run_id=run_id, task_id="fake")
        version = adapter_version_create(tenant=run.tenant, parent=run.parent_version,
                                         metrics={"training_run": run_id})
        training_services.run_attach_version(run=run, version=version)
        assert training_services.run_succeed(run_id=run_id, metrics=[], trained_sample_ids=run.sample_ids,
                                             dropped=[], resumed_from_step=None)
        AdapterVersion.objects.filter(tenant=run.tenant, state=AdapterVersion.State.ACTIVE).update(
            state=AdapterVersion.State.RETIRED)
        AdapterVersion.objects.filter(pk=version.pk).update(state=AdapterVersion.State.ACTIVE, eval_score=1.0)
        self.trained.append(run_id)


@pytest.mark.django_db
def test_one_method_drives_signup_review_training_and_measurement_through_the_api(tmp_path, monkeypatch):
    from workers.celery import app

    monkeypatch.setattr(app, "send_task", lambda *a, **k: type("R", (), {"id": "t"})())  # never enqueued here
    log: list[dict] = []
    worker = WorkerOnPoll()
    config = BenchConfig(base_url="http://localhost", methods=("combine",), personas=("brief",), group=True,
                         max_updates=1, batch_size=4, turns_per_session=2, out_dir=tmp_path, poll=0.01,
                         noise=0.0,  # the plumbing, with users that always mean what they say
                         serve_grace=0, judge_wait=5, update_timeout=60,
                         # One thread: the test's database transaction is this thread's.
                         eval_concurrency=1, parallel_sessions=1)
    lines: list[str] = []
    bench = Bench(config, echo=lines.append, log=lambda line: None, transport=worker,
                  client_factory=lambda base_url, secret: FakeGateway(secret, log))
    try:
        results = bench.run()
    finally:
        bench.close()

    assert len(results) == 1 and json.loads(lines[-1]) == results[0]
    result = results[0]
    student, group = result["brief"], result["group"]
    # Base model: its long, formatted habit (0.0); after one promoted update: brief (1.0), the target.
    assert student["compliance"] == [0.0, 1.0] and student["updates_to_target"] == 1, student
    asked = len(C.QUESTIONS)
    assert student["capability"] == [1.0, round((asked - 1) / asked, 4)] and student["prompt_only"] == 0.5
    assert student["judge_agreement"]["agreement"] == 1.0  # noise 0: the rule judge read every reaction
    assert student["judge_agreement"]["judged"] == student["judge_agreement"]["reactions"] >= 4
    assert student["sessions_to_target"] >= 2 and student["error"] is None
    assert len(student["feedback_to_served_s"]) == 1 and 0 <= student["feedback_to_served_s"][0] < 60
    assert group["with_adversary"]["compliance"] == [0.0, 1.0], group["with_adversary"]["error"]
    assert group["without_adversary"]["compliance"] == [0.0, 1.0]
    assert group["adversary_shift"]["final"] == 0.0
    assert len(worker.trained) == 3  # one run per tenant: student, group, control group

    # What the bench set up through the API.
    student_tenant = student["tenant"]
    rules = JudgeRules.objects.get(tenant_id=student_tenant)
    assert rules.judge == "rule" and rules.negative_patterns == P.JUDGE_RULES["negative_patterns"]
    assert ReviewPolicy.objects.get(tenant_id=student_tenant).mode == "auto"
    assert ReviewPolicy.objects.get(tenant_id=group["with_adversary"]["tenant"]).mode == "flagged"
    ts = TrainingSettings.objects.get(tenant_id=student_tenant)
    assert (ts.method, ts.overrides, ts.batch_size) == ("combine", {}, 4)
    # A personal tenant's samples are approved by the auto policy; the group's were held by the new-key guard
    # (bench keys are minutes old) and approved by the bench as the group's owner.
    trained = Sample.objects.filter(tenant_id=student_tenant, trained_at__isnull=False)
    assert trained.count() == 4 and all(s.decided_by is None and not s.flags for s in trained)
    group_tenant = group["with_adversary"]["tenant"]
    group_trained = Sample.objects.filter(tenant_id=group_tenant, trained_at__isnull=False)
    assert group_trained.count() == 4
    # Approved by the owner, or, for the owner's own samples, by the group's admin (never by their author).
    assert all(s.decided_by.email.endswith(("-owner@example.com", "-group-member@example.com"))
               and s.decided_by_id != s.user_id and "new_key" in s.flag_codes
               for s in group_trained.select_related("decided_by"))

    # How it talked to /v1: sessions end with X-Session-Done; measurements are side turns, held-out prompts at
    # the served temperature (none sent), the capability guard greedy.
    evals = [e for e in log if e["headers"].get("X-Turn-Type") == "side"]
    held_out = len(P.held_out_prompts()) * config.eval_samples
    # Per tenant: the base (held-out, guard, prompt-only) and after the update (held-out, guard).
    assert len(evals) == 3 * (3 * held_out + 2 * len(C.QUESTIONS))
    assert all(e["headers"]["X-Session-Done"] == "true" for e in evals)
    assert {e["temperature"] for e in evals} == {None, 0.0}
    chats = [e for e in log if "X-Turn-Type" not in e["headers"]]
    by_session: dict[str, list[dict]] = {}
    for e in chats:
        by_session.setdefault(e["headers"]["X-Session-Id"], []).append(e)
    assert by_session and all(turns[-1]["headers"].get("X-Session-Done") == "true" and
                              not any("X-Session-Done" in t["headers"] for t in turns[:-1])
                              for turns in by_session.values())
    assert (tmp_path / "compliance.png").read_bytes().startswith(b"\x89PNG")
    assert (tmp_path / "progress.jsonl").exists() and (tmp_path / "results.jsonl").exists()
    accounts = json.loads((tmp_path / "accounts.json").read_text())
    assert accounts["tenants"]["combine brief"]["tenant"] == student_tenant
    assert (tmp_path / "accounts.json").stat().st_mode & 0o077 == 0  # the password: for its owner only


def test_feedback_stages_split_feedback_to_served_by_the_run_and_version_timestamps():
    from datetime import UTC, datetime

    from clawhub.devtools.personas.measure import feedback_stages

    def at(seconds: float) -> str:
        return datetime.fromtimestamp(1_800_000_000 + seconds, tz=UTC).isoformat().replace("+00:00", "Z")

    run = {"created_at": at(12), "started_at": at(13.5), "finished_at": at(40)}
    stages = feedback_stages(last_feedback=1_800_000_000, run=run, version={"promoted_at": at(55)},
                             seen=1_800_000_000 + 57)

    assert stages == {"to_claim": 12.0, "queued": 1.5, "train": 26.5, "gate_and_load": 15.0, "noticed": 2.0}
    assert sum(stages.values()) == 57.0
    # A version never promoted has no gate-and-load or noticed stage.
    assert set(feedback_stages(last_feedback=1_800_000_000, run=run, version={}, seen=0)) == {
        "to_claim", "queued", "train"}
