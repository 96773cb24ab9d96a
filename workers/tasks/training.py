"""Training tasks: train a claimed batch, and start runs for tenants with a full batch (the new version's
gate and promotion: ``workers.tasks.promotion``). The bridge between ``clawhub`` (rows) and
``workers.trainer`` (plain data).

Worker for the ``train`` queue (one GPU, one run at a time; a task is acknowledged only after it finished):

    celery -A workers.celery worker -Q train --concurrency 1 --prefetch-multiplier 1 --pool solo

``clawhub.train.run`` is idempotent and resumable: a run that is no longer queued/running is left alone; a
redelivered run (the worker died: ``acks_late`` + ``reject_on_worker_lost`` leave the message to the broker,
which delivers it again after CELERY_BROKER_VISIBILITY_TIMEOUT) starts the backend on the same workdir, which
resumes after the last checkpointed optimizer step and trains the same claimed samples in the same order, so
no step is repeated and no sample is lost. Housekeeping (kick, sweep, unload) runs on the ``housekeeping``
queue, which the judge workers consume too, so that it never waits behind an hour of training.
"""

import json
import logging
import time
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from celery.signals import celeryd_after_setup
from django.conf import settings

from clawhub.adapters import services as adapter_services
from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.selectors import (
    version_lag,
    version_lineage,
)
from clawhub.conversations.selectors import (
    RERENDERED,
    SERVED_IDS,
    turn_prompt_token_ids,
    turn_request,
    turn_training_source,
)
from clawhub.core import tasks
from clawhub.review.models import Sample
from clawhub.review.selectors import train_sample_with_feedback
from clawhub.training import services
from clawhub.training.models import TrainingRun
from clawhub.training.selectors import run_for_task, samples_of_run
from workers.celery import app
from workers.trainer.backend import TrainConfig, TrainingBackend, TrainSample

logger = logging.getLogger("workers.tasks.training")


class RunCancelled(Exception):
    pass


@celeryd_after_setup.connect
def warm_trainer_imports(sender: str, instance: Any, **kwargs: Any) -> None:
    """A worker that consumes the train queue imports the trainer (torch, transformers, peft) once, before its
    pool starts, so that a run's time limits count training and not imports: a soft limit that fires inside an
    import leaves the module half-made and every later run on that worker fails with an error."""
    consumed = instance.app.amqp.queues.consume_from  # empty when the worker consumes every queue
    if consumed and tasks.TRAIN_QUEUE not in consumed:
        return
    import workers.trainer.local  # noqa: F401


# --- from rows to plain data --------------------------------------------------------------------------------


def response_text(message: dict[str, Any]) -> str:
    """The assistant output as the model wrote it, for turns served without token ids (the re-render
    fallback): the reasoning in a ``<think>`` block first (the format of Qwen3-style thinking templates),
    then the content, then the tool calls in the hermes format vLLM parsed them from (Qwen's chat template).
    Turns served with ids never need this: their sampled ids are the output."""
    text = message.get("content") or ""
    reasoning = message.get("reasoning_content") or message.get("reasoning")
    if reasoning:
        text = f"<think>\n{reasoning}\n</think>\n\n{text}"
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        arguments = function.get("arguments")
        try:
            arguments = json.loads(arguments) if isinstance(arguments, str) else arguments
        except ValueError:
            pass
        payload = json.dumps({"name": function.get("name"), "arguments": arguments}, ensure_ascii=False)
        text += f"{chr(10) if text else ''}<tool_call>\n{payload}\n</tool_call>"
    return text


def train_sample(sample: Sample, *, lineage: list[int] | None = None) -> TrainSample:
    """The sample as the trainer sees it: the served prompt ids + sampled ids + sampling-time log-probs when
    the turn has them, else the messages for the chat-template fallback (``source`` says which, and why);
    how the reply was sampled (the turn's recorded sampling); and, given the lineage of the version being
    trained (adapters.selectors.version_lineage), how many versions behind it the serving version is."""
    turn = sample.turn
    request = turn_request(turn=turn)
    choice = (turn.response or [{}])[0]
    message = (
        choice.get("message") if isinstance(choice.get("message"), dict) else {"content": choice.get("text")}
    )
    path, why = turn_training_source(turn=turn)
    prompt_ids = turn_prompt_token_ids(turn=turn) if path == SERVED_IDS else None
    if path == SERVED_IDS and prompt_ids is None:
        path, why = RERENDERED, "stored prompt ids could not be rebuilt"
    kwargs = request.get("chat_template_kwargs")
    logprobs = turn.logprobs or None
    constrained = constrained_decoding(request)
    if constrained and path == SERVED_IDS:
        # vLLM masks the logits with the grammar before it computes log-probs, so the recorded ones are of the
        # constrained distribution, not the policy's: the trainer recomputes pi_old instead.
        logprobs, why = None, f"pi_old recomputed: sampled under constrained decoding ({constrained})"
    processed = unmodelled_processing(request)
    if processed and logprobs:
        # Processed log-probs include penalties and biases the trainer's policy does not apply.
        logprobs, why = None, "; ".join(filter(None, [why, f"pi_old recomputed: sampled with {processed}"]))
    sampling = turn.sampling or {}
    train = TrainSample(
        sample_id=sample.pk,
        messages=request.get("messages") or [{"role": "user", "content": str(request.get("prompt") or "")}],
        tools=request.get("tools") or None,
        response_text=response_text(message),
        response_token_ids=turn.token_ids or None,
        response_logprobs=logprobs,
        reward=sample.reward,
        hints=[h for h in (sample.judgment.hints or []) if isinstance(h, str) and h.strip()],
        member_id=sample.user_id,
        weight=sample.train_weight,
        prompt_token_ids=prompt_ids,
        chat_template_kwargs=kwargs if isinstance(kwargs, dict) else None,
        source=(f"{path}; {why}" if why else path) if path == SERVED_IDS else f"{path}: {why}",
        # Rows recorded before the sampling was: temperature 1 and an unknown mode (pi_old recomputed).
        temperature=sampling.get("temperature", 1.0),
        top_p=sampling.get("top_p", 1.0),
        top_k=sampling.get("top_k", 0),
        logprobs_mode=sampling.get("logprobs_mode", ""),
        version_lag=(
            None if lineage is None else version_lag(served_id=turn.adapter_version_id, lineage=lineage)
        ),
    )
    # A person's own rating outranks the judge's hints; a corrected reply is trained in place of the reply.
    return train_sample_with_feedback(train, judgment=sample.judgment)


def constrained_decoding(request: dict[str, Any]) -> str:
    """Why the reply was sampled under a grammar (a forced or required tool call, a JSON format, vLLM's
    structured outputs), or "" when it was sampled from the model's own distribution."""
    choice = request.get("tool_choice")
    if request.get("tools") and (choice == "required" or isinstance(choice, dict)):
        return "tool_choice " + (choice if isinstance(choice, str) else "named function")
    fmt = request.get("response_format")
    if isinstance(fmt, dict) and fmt.get("type") in ("json_object", "json_schema", "structural_tag"):
        return f"response_format {fmt['type']}"
    for field in ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar"):
        if request.get(field):
            return field
    return ""


# Logit processing vLLM applies before its processed log-probs and the trainer's policy does not, with the
# value that turns it off.
UNMODELLED = {
    "presence_penalty": 0, "frequency_penalty": 0, "repetition_penalty": 1, "min_p": 0, "min_tokens": 0,
    "logit_bias": None, "bad_words": None, "allowed_token_ids": None,
}


def unmodelled_processing(request: dict[str, Any]) -> str:
    """The request's sampling options that change the distribution in ways the trainer does not reproduce
    (penalties, biases, min_p, ...), named, or "" when there are none."""
    return ", ".join(
        name for name, off in UNMODELLED.items() if request.get(name) not in (off, None, [], {})
    )


def make_backend(name: str) -> TrainingBackend:
    """The backend a run names (workers.trainer.registry), with credentials and bounds from settings.
    Credentials come from the environment only (never from a row): they live on the backend instance for the
    run and are not logged."""
    from workers.trainer.registry import backend_from_config

    return backend_from_config(name, settings)


# --- the run ------------------------------------------------------------------------------------------------


@app.task(
    name=tasks.TRAIN_RUN,
    queue=tasks.TRAIN_QUEUE,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    soft_time_limit=settings.CLAWHUB_TRAIN_SOFT_TIME_LIMIT,
    time_limit=settings.CLAWHUB_TRAIN_TIME_LIMIT,
    max_retries=3,
    ignore_result=True,
)
def train_run(self, run_id: int) -> dict[str, Any]:
    # The soft time limit as a deadline checked after every optimizer step: a worker with --pool solo (one per
    # GPU, as production runs them) has no way to interrupt a task, so Celery's own soft limit never fires.
    deadline = time.monotonic() + settings.CLAWHUB_TRAIN_SOFT_TIME_LIMIT
    task_id = self.request.id or ""
    owner = _pass_owner(run_id)
    if owner not in (None, task_id):
        # Another task's multi-tenant pass trains this run (and sends its promotion): nothing to do here.
        return {"run": run_id, "outcome": "in_pass", "pass_task": owner}
    run = services.run_mark_running(run_id=run_id, task_id=task_id)
    if run is None:
        # Finished, failed or cancelled. A worker that died between "succeeded" and sending the promotion
        # left a candidate nobody will evaluate: this redelivery sends it (the sweeper is the backstop).
        done = run_for_task(run_id=run_id)
        version = done.adapter_version if done is not None else None
        if (
            done is not None
            and done.state == TrainingRun.State.SUCCEEDED
            # A run trained in another task's pass had its promotion sent by that task (the sweeper is the
            # backstop should that worker have died in between).
            and (done.remote_ids or {}).get("pass_task") in (None, task_id)
            and version is not None
            and version.state == AdapterVersion.State.CANDIDATE
            and version.held_at is None
            and version.evaluating_since is None
        ):
            tasks.enqueue(tasks.PROMOTE, version.pk)
            return {"run": run_id, "outcome": "promote_resent", "version": version.version}
        return {"run": run_id, "outcome": "not_open"}
    try:
        run = services.run_resolve_parent(run_id=run_id)
        companions = _pass_companions(run, task_id=task_id)
        if companions:
            version = _train_pass(run, companions, deadline=deadline)
        else:
            version = _train(run, deadline=deadline)
    except RunCancelled:
        return {"run": run_id, "outcome": "cancelled"}
    except SoftTimeLimitExceeded:
        services.run_fail(
            run_id=run_id,
            error="The run went past CLAWHUB_TRAIN_SOFT_TIME_LIMIT.",
            failure=TrainingRun.Failure.TIMEOUT,
        )
        return {"run": run_id, "outcome": "failed"}
    except Exception as exc:
        from workers.trainer.remote import RemoteTrainingError

        retries = settings.CLAWHUB_REMOTE_RUN_RETRIES
        if isinstance(exc, RemoteTrainingError) and exc.transient and self.request.retries < retries:
            # The remote service hiccuped past the per-call budget: the same run resumes from its remote
            # checkpoint later (the samples stay claimed meanwhile).
            logger.warning("training run %s: %s; retrying the run", run_id, exc)
            raise self.retry(exc=exc, countdown=30 * 2**self.request.retries, max_retries=retries) from None
        logger.exception("training run %s failed", run_id)
        services.run_fail(run_id=run_id, error=f"{type(exc).__name__}: {exc}")
        return {"run": run_id, "outcome": "failed"}
    if version is None:
        return {"run": run_id, "outcome": "cancelled"}
    tasks.enqueue(tasks.PROMOTE, version.pk)
    return {"run": run_id, "outcome": "succeeded", "version": version.version}


def _batch_of(run: TrainingRun) -> list[TrainSample]:
    lineage = version_lineage(version=run.parent_version)
    batch = [train_sample(s, lineage=lineage) for s in samples_of_run(run=run)]
    if not batch:
        raise ValueError("none of the run's claimed samples is left to train on")
    return batch


def _step_recorder(run_id: int, deadline: float):
    def on_step(metrics) -> None:
        state = services.run_record_step(run_id=run_id, metrics=metrics.to_dict())
        if state != TrainingRun.State.RUNNING:
            raise RunCancelled()
        if time.monotonic() > deadline:
            raise SoftTimeLimitExceeded("past CLAWHUB_TRAIN_SOFT_TIME_LIMIT (checked between steps)")

    return on_step


def _train(run: TrainingRun, *, deadline: float) -> AdapterVersion | None:
    batch = _batch_of(run)
    backend = make_backend(run.backend)
    parent_dir = run.parent_version.artifact_path if run.parent_version else None
    try:
        backend.start(run.base_model, parent_dir, TrainConfig.from_dict(run.config), run.workdir)
        # Shown on the run's page while it trains: where to look for it on the remote service.
        services.run_set_remote_ids(run_id=run.pk, remote_ids=backend.remote_ids())
        result = backend.train(batch, on_step=_step_recorder(run.pk, deadline))
        version = _version_of(run, result)
        if version is None:
            return None
        backend.export_adapter(version.artifact_path)
        remote_ids = backend.remote_ids()
    finally:
        backend.close()
    return _succeed(run, version, result, remote_ids)


def _version_of(run: TrainingRun, result) -> AdapterVersion | None:
    """The candidate version a trained run becomes (None when the run was cancelled meanwhile)."""
    run.refresh_from_db()
    if run.state != TrainingRun.State.RUNNING:
        return None
    version = run.adapter_version
    if version is None:  # a redelivery after the version was created reuses it (and re-exports)
        version = adapter_services.adapter_version_create(
            tenant=run.tenant,
            parent=run.parent_version,
            metrics={
                "training_run": run.pk,
                "steps": result.steps,
                "method": run.method,
                "backend": run.backend,
                "samples": len(result.trained_sample_ids),
                "heldout": len(run.heldout_ids or []),
                "mean_reward": result.metrics[-1].mean_reward if result.metrics else None,
                # Optimizer continuity: the AdamW steps the parent's state had taken (None = fresh).
                "optimizer_resumed_at": result.optimizer_resumed_at,
                "optimizer_note": result.optimizer_note,
                # Local backend: the resident base's loads/runs in this worker, a multi-tenant pass.
                "trainer": result.runtime,
            },
        )
        services.run_attach_version(run=run, version=version)
    return version


def _succeed(run: TrainingRun, version: AdapterVersion, result, remote_ids: dict) -> AdapterVersion | None:
    ok = services.run_succeed(
        run_id=run.pk,
        metrics=[m.to_dict() for m in result.metrics],
        trained_sample_ids=list(result.trained_sample_ids),
        dropped=[{"sample_id": d.sample_id, "reason": d.reason} for d in result.dropped],
        sample_notes=result.sample_notes,
        resumed_from_step=result.resumed_from_step or _resumed_from(run),
        remote_ids=remote_ids,
    )
    return version if ok else None


# --- multi-tenant passes ------------------------------------------------------------------------------------


def _pass_owner(run_id: int) -> str | None:
    """The train task whose multi-tenant pass holds this run while it runs, if any."""
    run = run_for_task(run_id=run_id)
    if run is None or run.state != TrainingRun.State.RUNNING:
        return None
    return (run.remote_ids or {}).get("pass_task")


def _pass_companions(run: TrainingRun, *, task_id: str) -> list[TrainingRun]:
    """Other tenants' runs to train in one pass with `run` (CLAWHUB_TRAIN_PASS_TENANTS > 1, local backend):
    those this task took before a redelivery, then queued ones on the same base model, device and dtype,
    oldest first, one per tenant, tenants within their compute budget, while the pass's batches stay within
    CLAWHUB_TRAIN_PASS_TOKENS (workers.trainer.schedule); the others stay queued for a next pass."""
    most = settings.CLAWHUB_TRAIN_PASS_TENANTS
    if most <= 1 or run.backend != "local" or not task_id:
        return []
    from clawhub.training.budget import budget_refusal
    from clawhub.training.selectors import run_tokens, runs_in_pass, runs_ready_for_pass
    from workers.trainer.schedule import ReadyBatch, choose_pass

    def group(r: TrainingRun) -> tuple:
        config = TrainConfig.from_dict(r.config)
        return (config.device, config.dtype)

    taken = [r for r in runs_in_pass(task_id=task_id) if r.pk != run.pk]
    free = most - 1 - len(taken)
    if free > 0:
        candidates = [
            r for r in runs_ready_for_pass(base_model=run.base_model, exclude_tenant_id=run.tenant_id,
                                           limit=4 * free)
            if group(r) == group(run) and r.tenant_id not in {t.tenant_id for t in taken}
        ]
        tokens = run_tokens(runs=[run, *taken, *candidates])
        # What is in the pass already, as one batch that goes first (choose_pass always takes the first).
        inside = ReadyBatch(key=None, tenant_id=None, ready_at=float("-inf"),
                            tokens=sum(tokens[r.pk] for r in [run, *taken]))
        ready = [inside] + [
            ReadyBatch(r.pk, r.tenant_id, ready_at=r.created_at.timestamp(), tokens=tokens[r.pk])
            for r in candidates
        ]
        chosen = choose_pass(
            ready, within_budget=lambda t: t is None or budget_refusal(tenant_id=t) is None,
            max_tenants=free + 1, max_tokens=settings.CLAWHUB_TRAIN_PASS_TOKENS,
        )
        for batch in chosen[1:]:
            if services.run_join_pass(run_id=batch.key, task_id=task_id) is not None:
                taken.append(batch.key)
    return [services.run_resolve_parent(run_id=r if isinstance(r, int) else r.pk) for r in taken]


def _train_pass(run: TrainingRun, companions: list[TrainingRun], *, deadline: float) -> AdapterVersion | None:
    """Train `run` and its companions in one multi-tenant pass. The companions are finished here (failed,
    or succeeded with their promotion sent); `run`'s own outcome is returned, or its error raised, for the
    task to handle as for a run trained alone."""
    from workers.trainer.multitenant import MultiTenantPass, TenantJob

    runs, jobs = [], []
    for r in [run, *companions]:
        try:
            batch = _batch_of(r)
        except ValueError as exc:
            if r.pk == run.pk:
                raise
            services.run_fail(run_id=r.pk, error=str(exc))
            continue
        parent_dir = r.parent_version.artifact_path if r.parent_version else None
        runs.append(r)
        jobs.append(TenantJob(str(r.pk), TrainConfig.from_dict(r.config), r.workdir, batch, parent_dir,
                              _step_recorder(r.pk, deadline)))
    finished: dict[int, tuple[AdapterVersion | None, Any]] = {}
    try:
        with MultiTenantPass(run.base_model, jobs) as mt:
            for r, outcome in zip(runs, mt.train(), strict=True):
                if outcome.exception is not None:
                    finished[r.pk] = (None, outcome.exception)
                    continue
                version = _version_of(r, outcome.result)
                if version is not None:
                    outcome.backend.export_adapter(version.artifact_path)
                finished[r.pk] = (version, outcome.result)
    except Exception as exc:
        for r in runs[1:]:
            services.run_fail(run_id=r.pk, error=f"the multi-tenant pass failed: {type(exc).__name__}: {exc}")
        raise
    for r in runs[1:]:
        version, outcome = finished[r.pk]
        if isinstance(outcome, RunCancelled):
            continue
        if isinstance(outcome, SoftTimeLimitExceeded):
            services.run_fail(run_id=r.pk, error="The run went past CLAWHUB_TRAIN_SOFT_TIME_LIMIT.",
                              failure=TrainingRun.Failure.TIMEOUT)
        elif isinstance(outcome, Exception):
            services.run_fail(run_id=r.pk, error=f"{type(outcome).__name__}: {outcome}")
        elif version is not None and _succeed(r, version, outcome, {}) is not None:
            tasks.enqueue(tasks.PROMOTE, version.pk)
    version, outcome = finished[run.pk]
    if isinstance(outcome, Exception):
        raise outcome
    return _succeed(run, version, outcome, {}) if version is not None else None


def _resumed_from(run: TrainingRun) -> int | None:
    # A redelivered task that found the train() call already complete reports no resume step; the run's own
    # progress says where the crash was.
    return run.step if run.attempts > 1 else None


@app.task(name=tasks.TRAIN_KICK, queue=tasks.HOUSEKEEPING_QUEUE, ignore_result=True)
def kick() -> list[int]:
    """Periodic: a run for each tenant with a full batch approved (instead of a hook in the review code)."""
    return services.runs_kick()
