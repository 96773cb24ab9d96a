"""Writes for training runs: starting one (with its atomic claim of samples), progress, and the ends of a run
(succeeded, failed, cancelled). A tenant's training settings are written in settings_services.py.

Claims: a run takes its samples in the transaction that creates it, with the tenant row locked (so two starts
for one tenant queue up behind each other and the second sees the first run) and the sample rows locked with
``SELECT … FOR UPDATE SKIP LOCKED`` and re-checked unclaimed (so a sample can never be in two runs, whatever
else claims or decides at the same time). A run that fails or is cancelled gives its samples back to the pool;
one that succeeds marks them ``trained_at`` and they are never offered again.
"""

import logging
import secrets
from pathlib import Path
from typing import Any

from django.conf import settings
from django.db import IntegrityError, transaction
from django.db.models import Count
from django.utils import timezone

from clawhub.accounts.audit import audit_record_for_tenant as _audit
from clawhub.adapters.models import AdapterVersion
from clawhub.core import tasks
from clawhub.core.exceptions import Conflict
from clawhub.review.models import Sample
from clawhub.review.selectors import samples_for_training, trainable_count
from clawhub.review.services import consensus_holds_refresh
from clawhub.tenants.access import TenantAccess
from clawhub.tenants.models import Tenant
from clawhub.training import budget, influence
from clawhub.training.models import TrainingRun
from clawhub.training.selectors import (
    backend_for,
    batch_size_for,
    effective_config,
    samples_held_back,
    training_settings_for,
    version_in_flight,
)
from clawhub.training.settings_services import validate_config

logger = logging.getLogger("clawhub.training")


# --- start and claim ----------------------------------------------------------------------------------------


def run_start(*, tenant: Tenant, access: TenantAccess | None = None, ip: str | None = None) -> TrainingRun:
    """Starts a run: by an owner/admin/staff (``access``; any number of approved samples will do), or
    automatically (``access=None``; only with a full batch and auto start on). Claims the samples atomically
    and enqueues the train task once the claim has committed.

    Long on purpose: one transaction under the tenant's lock, whose checks (no open run, no candidate in
    flight, enough samples) and claim must be read together to see that two starts cannot both claim."""
    actor = None
    if access is not None:
        access.require_manage("start training")
        actor = access.actor
    ts = training_settings_for(tenant=tenant)
    batch_size = batch_size_for(ts)
    config = effective_config(ts)
    validate_config(config)
    budget.budget_check(tenant=tenant, access=access)  # 429 over the tenant's GPU-seconds or runs per hour
    try:
        with transaction.atomic():
            Tenant.objects.select_for_update().get(pk=tenant.pk)  # one start per tenant at a time
            if TrainingRun.objects.filter(tenant=tenant, state__in=TrainingRun.OPEN_STATES).exists():
                raise Conflict(
                    "A training run of this tenant is already queued or running.", code="run_in_progress"
                )
            if actor is None and not ts.auto_start:
                raise Conflict("Automatic training is off for this tenant.", code="auto_start_off")
            waiting_on = version_in_flight(tenant=tenant)
            if waiting_on is not None:
                # Queued behind it: this batch must train from whatever that candidate becomes (the parent is
                # resolved when training starts, and the promote task kicks the tenant when it is done).
                raise Conflict(
                    f"Version {waiting_on.version} is still being evaluated and promoted; the next run "
                    "starts after it.",
                    code="candidate_in_flight",
                    version=waiting_on.version,
                )
            # Samples whose runs keep timing out wait (with their reason) instead of failing batch after
            # batch.
            skip = set(samples_held_back(tenant=tenant)) if actor is None else set()
            if tenant.kind == Tenant.Kind.GROUP:
                consensus_holds_refresh(tenant=tenant)  # a member found disagreeing now waits for review
            offered = samples_for_training(tenant=tenant, limit=batch_size + len(skip))
            wanted = [s.pk for s in offered if s.pk not in skip][:batch_size]
            claimed = list(
                Sample.objects.select_for_update(skip_locked=True)
                .filter(
                    pk__in=wanted,
                    tenant=tenant,
                    state=Sample.State.APPROVED,
                    training_run_id__isnull=True,
                    trained_at__isnull=True,
                )
                .order_by("created_at", "id")
                .values_list("pk", flat=True)
            )
            if not claimed or (actor is None and len(claimed) < batch_size):
                raise Conflict(
                    f"Not enough approved samples to train on ({len(claimed)}"
                    f"{'' if actor else f' of {batch_size}'}).",
                    code="not_enough_samples",
                    available=len(claimed),
                    batch_size=batch_size,
                )
            heldout = heldout_by_session(claimed, every=settings.CLAWHUB_GATE_HOLDOUT_EVERY)
            run = TrainingRun.objects.create(
                tenant=tenant,
                backend=backend_for(ts),
                method=ts.method,
                config=config,
                base_model=settings.CLAWHUB_TRAIN_BASE_MODEL,
                started_by=actor,
                sample_ids=[pk for pk in claimed if pk not in heldout],
                heldout_ids=heldout,
            )
            # The id alone is not enough: a fresh database hands out the same ids again, and a checkpoint left
            # in the workdir of an old "run-1" would be resumed as if it were this run's.
            run.workdir = str(Path(settings.CLAWHUB_TRAIN_WORKDIR) / f"run-{run.pk}-{secrets.token_hex(4)}")
            run.save(update_fields=["workdir"])
            Sample.objects.filter(pk__in=claimed).update(training_run_id=run.pk)
            # Each member's share of the update's advantage mass is bounded through per-sample loss weights.
            influence.batch_weights_set(tenant=tenant, sample_ids=run.sample_ids, method=run.method,
                                        config=config)
            _audit(
                actor=actor,
                action="training.run_started",
                target=run,
                tenant=tenant,
                ip=ip,
                samples=len(claimed),
                backend=run.backend,
                method=run.method,
                automatic=actor is None,
            )
            run_id = run.pk
            tasks.enqueue_on_commit(tasks.TRAIN_RUN, run_id,
                                    then=lambda result: _task_id_record(run_id, result.id))
    except IntegrityError:
        # Another start won the race between our check and our insert: the partial unique constraint.
        raise Conflict(
            "A training run of this tenant is already queued or running.", code="run_in_progress"
        ) from None
    return run


def heldout_by_session(claimed: list[int], *, every: int) -> list[int]:
    """The eval gate's held-out slice of a claimed batch: every `every`-th session of the batch (in claim
    order), with all of its claimed samples (0 = none). Whole sessions, so that no held-out turn shares a
    session with a turn trained in the same batch: a held-out reply next to its own session's trained turns
    would score the update on what it was just trained on, and the gate's interval would be over-confident."""
    if not every:
        return []
    session_of = dict(Sample.objects.filter(pk__in=claimed).values_list("pk", "turn__session_id"))
    order: dict[int, int] = {}
    for pk in claimed:
        order.setdefault(session_of[pk], len(order) + 1)
    return [pk for pk in claimed if order[session_of[pk]] % every == 0]


def _task_id_record(run_id: int, task_id: str) -> None:
    TrainingRun.objects.filter(pk=run_id, task_id="").update(task_id=task_id)


def runs_kick(*, tenant_ids: list[int] | None = None) -> list[int]:
    """Periodic ("clawhub.train.kick"): a run for every tenant with a full batch of approved samples, auto
    start on, no run open and no candidate in flight; ``tenant_ids`` limits it (the promote task kicks its
    tenant as soon as the candidate it waited behind is done). Returns the new runs' ids."""
    candidates = (
        Sample.objects.filter(
            state=Sample.State.APPROVED, trained_at__isnull=True, training_run_id__isnull=True
        )
        .values("tenant_id")
        .annotate(n=Count("id"))
    )
    if tenant_ids is not None:
        candidates = candidates.filter(tenant_id__in=tenant_ids)
    started = []
    for row in budget.fair_order(candidates):  # least-served tenants first; over-budget ones wait
        tenant = Tenant.objects.select_related("group", "user").get(pk=row["tenant_id"])
        ts = training_settings_for(tenant=tenant)
        if (
            not ts.auto_start
            or row["n"] < batch_size_for(ts)
            or trainable_count(tenant=tenant) < batch_size_for(ts)
        ):
            continue
        try:
            started.append(run_start(tenant=tenant).pk)
        except Conflict:
            continue  # a run is open, or guards (member cap) left the batch short: next time
    return started


# --- progress and ends, written by the train task ----------------------------------------------------------


def run_mark_running(*, run_id: int, task_id: str) -> TrainingRun | None:
    """The task took the run (first delivery or a redelivery). None if the run is no longer open. A run
    delivered CLAWHUB_TRAIN_MAX_ATTEMPTS times without finishing (its worker killed at the hard time limit,
    again and again) fails as a time-out instead of being redelivered for ever."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().filter(pk=run_id).first()
        if run is None or not run.is_open:
            return None
        if run.attempts >= settings.CLAWHUB_TRAIN_MAX_ATTEMPTS:
            transaction.on_commit(
                lambda: run_fail(
                    run_id=run_id,
                    error=f"delivered {run.attempts} times without finishing (CLAWHUB_TRAIN_MAX_ATTEMPTS)",
                    failure=TrainingRun.Failure.TIMEOUT,
                )
            )
            return None
        run.state = TrainingRun.State.RUNNING
        run.task_id = task_id or run.task_id
        run.attempts += 1
        run.started_at = run.started_at or timezone.now()
        run.save(update_fields=["state", "task_id", "attempts", "started_at"])
    return run


def run_join_pass(*, run_id: int, task_id: str) -> TrainingRun | None:
    """A queued run taken into the multi-tenant pass of train task `task_id`: running, owned by that task
    (remote_ids["pass_task"]); its own message, when a worker gets it, leaves it to the pass. None when the
    run is no longer queued (another task took it, or it was cancelled)."""
    with transaction.atomic():
        queued = TrainingRun.objects.select_for_update().filter(pk=run_id, state=TrainingRun.State.QUEUED)
        run = queued.first()
        if run is None:
            return None
        run.state = TrainingRun.State.RUNNING
        run.attempts += 1
        run.started_at = run.started_at or timezone.now()
        run.remote_ids = {**(run.remote_ids or {}), "pass_task": task_id}
        run.save(update_fields=["state", "attempts", "started_at", "remote_ids"])
    return run


def run_resolve_parent(*, run_id: int) -> TrainingRun:
    """Fixes the version the run continues, once, when it starts training: the tenant's active version now
    (not at claim time, when the previous candidate may still have been on its way). A redelivered run keeps
    the parent it resolved first, since its checkpoint continues that one."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().get(pk=run_id)
        if run.parent_resolved_at is None:
            Tenant.objects.select_for_update().filter(pk=run.tenant_id).first()  # against a concurrent switch
            run.parent_version = AdapterVersion.objects.filter(
                tenant_id=run.tenant_id, state=AdapterVersion.State.ACTIVE
            ).first()
            run.parent_resolved_at = timezone.now()
            run.save(update_fields=["parent_version", "parent_resolved_at"])
    return TrainingRun.objects.select_related("tenant", "parent_version", "adapter_version").get(pk=run_id)


def run_samples_requeue(*, run: TrainingRun, reason: str) -> int:
    """A run's version cannot join the lineage (its parent was retired while it trained, or its promotion
    never completed): the samples it trained go back to the pool, to train into the next version from
    whatever is active then. Held-out samples stay out (they were never trained on)."""
    requeued = run.samples.filter(pk__in=run.sample_ids).update(
        training_run_id=None, trained_at=None
    )
    _audit(
        actor=None, action="training.samples_requeued", target=run, tenant=run.tenant, reason=reason,
        samples=requeued,
    )
    return requeued


def run_samples_requeue_once(*, run: TrainingRun) -> tuple[int, int]:
    """The gate rejected the run's version: the samples it trained go back to the pool once, so that a batch
    rejected by chance (a neutral update's interval can fall below 0) still trains; a sample that was in a
    batch the gate rejected before stays out (its feedback may be what the gate keeps rejecting), and so do
    the samples the trainer dropped. Returns (requeued, kept out)."""
    rejected_before: set[int] = set()
    for ids in (
        TrainingRun.objects.filter(tenant_id=run.tenant_id, adapter_version__decision="reject",
                                   adapter_version__state=AdapterVersion.State.REJECTED)
        .exclude(pk=run.pk)
        .values_list("sample_ids", flat=True)
    ):
        rejected_before.update(ids or [])
    dropped = {str(d.get("sample_id")) for d in run.dropped or []}
    trained = [pk for pk in run.sample_ids if str(pk) not in dropped]
    again = [pk for pk in trained if pk not in rejected_before]
    requeued = run.samples.filter(pk__in=again).update(training_run_id=None, trained_at=None)
    kept = len(trained) - len(again)
    _audit(
        actor=None, action="training.samples_requeued", target=run, tenant=run.tenant,
        reason="rejected by the promotion gate", samples=requeued, kept_out=kept,
    )
    return requeued, kept


def run_record_step(*, run_id: int, metrics: dict[str, Any]) -> str:
    """Stores one optimizer step's metrics (replacing a step recorded before a crash) and returns the run's
    state, so the task can stop when the run was cancelled."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().get(pk=run_id)
        if run.state != TrainingRun.State.RUNNING:
            return run.state
        step = int(metrics["step"])
        kept = [m for m in run.metrics if int(m.get("step", -1)) != step]
        run.metrics = sorted([*kept, metrics], key=lambda m: int(m["step"]))
        run.step = max(run.step, step)
        run.loss, run.mean_reward, run.mean_advantage = (
            metrics.get("loss"),
            metrics.get("mean_reward"),
            metrics.get("mean_advantage"),
        )
        run.tokens = sum(int(m.get("tokens", 0)) for m in run.metrics)
        run.seconds = round(sum(float(m.get("seconds", 0.0)) for m in run.metrics), 3)
        if metrics.get("dropped"):
            run.dropped = metrics["dropped"]
        run.save(
            update_fields=[
                "metrics",
                "step",
                "loss",
                "mean_reward",
                "mean_advantage",
                "tokens",
                "seconds",
                "dropped",
            ]
        )
        return run.state


def run_set_remote_ids(*, run_id: int, remote_ids: dict[str, str]) -> None:
    """Where the run lives on a remote service (its training run, checkpoints), as soon as it is known.
    Ids only: the backend's remote_ids() never includes credentials."""
    if remote_ids:
        TrainingRun.objects.filter(pk=run_id).update(remote_ids=remote_ids)


def run_attach_version(*, run: TrainingRun, version: AdapterVersion) -> None:
    TrainingRun.objects.filter(pk=run.pk).update(adapter_version=version)
    run.adapter_version = version


def run_succeed(
    *,
    run_id: int,
    metrics: list[dict],
    trained_sample_ids: list,
    dropped: list[dict],
    resumed_from_step: int | None,
    remote_ids: dict[str, str] | None = None,
    sample_notes: dict[str, dict] | None = None,
) -> bool:
    """The run trained and its adapter was exported: its samples are trained (never offered again). False if
    the run was cancelled in the meantime (then nothing is marked). sample_notes: per trained sample, where
    pi_old came from, the version lag and the sampler (TrainResult.sample_notes)."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().select_related("tenant").get(pk=run_id)
        if run.state != TrainingRun.State.RUNNING:
            return False
        now = timezone.now()
        # Every claimed sample was in the batch: the trained ones and those the trainer dropped (too long,
        # no signal) are done with; a dropped sample would be dropped again.
        Sample.objects.filter(training_run_id=run.pk, trained_at__isnull=True).update(trained_at=now)
        run.state, run.finished_at = TrainingRun.State.SUCCEEDED, now
        if metrics:
            run.metrics = metrics
            last = metrics[-1]
            run.step = int(last["step"])
            run.loss, run.mean_reward, run.mean_advantage = (
                last["loss"],
                last["mean_reward"],
                last["mean_advantage"],
            )
            run.tokens = sum(int(m.get("tokens", 0)) for m in metrics)
            run.seconds = round(sum(float(m.get("seconds", 0.0)) for m in metrics), 3)
        run.dropped = dropped
        run.sample_notes = sample_notes or {}
        run.remote_ids = remote_ids or run.remote_ids
        run.resumed_from_step = resumed_from_step if resumed_from_step is not None else run.resumed_from_step
        run.save()
        _audit(
            actor=None,
            action="training.run_succeeded",
            target=run,
            tenant=run.tenant,
            steps=run.step,
            trained=len(trained_sample_ids),
            dropped=len(dropped),
            version=run.adapter_version.version if run.adapter_version else None,
        )
    return True


def _release_samples(run: TrainingRun) -> int:
    return Sample.objects.filter(training_run_id=run.pk, trained_at__isnull=True).update(training_run_id=None)


def run_fail(*, run_id: int, error: str, failure: str = TrainingRun.Failure.ERROR) -> None:
    """The run cannot finish: its samples go back to the pool, the error stays on the run. A ``timeout`` is
    counted against the samples: after CLAWHUB_TRAIN_MAX_TIMEOUTS automatic runs skip them."""
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().select_related("tenant").get(pk=run_id)
        if not run.is_open:
            return
        released = _release_samples(run)
        run.state, run.error, run.finished_at = TrainingRun.State.FAILED, error[:10000], timezone.now()
        run.failure = failure
        run.save(update_fields=["state", "error", "finished_at", "failure"])
        _audit(
            actor=None,
            action="training.run_failed",
            target=run,
            tenant=run.tenant,
            error=error[:500],
            released=released,
        )


def run_cancel(*, access: TenantAccess, run: TrainingRun, ip: str | None = None) -> TrainingRun:
    """Stops a queued or running run: the task is revoked (a running one stops at its next step), the
    samples return to the pool."""
    access.require_manage("cancel training")
    with transaction.atomic():
        run = TrainingRun.objects.select_for_update().get(pk=run.pk)
        if not run.is_open:
            raise Conflict(
                f"The run is {run.state}; only queued or running runs can be cancelled.", code="run_not_open"
            )
        released = _release_samples(run)
        run.state, run.finished_at = TrainingRun.State.CANCELLED, timezone.now()
        run.error = f"cancelled by {access.actor.email}"
        run.save(update_fields=["state", "finished_at", "error"])
        _audit(
            actor=access.actor,
            action="training.run_cancelled",
            target=run,
            tenant=access.tenant,
            ip=ip,
            released=released,
        )
        task_id = run.task_id
        if task_id:
            transaction.on_commit(lambda: _revoke(task_id), robust=True)
    return run


def _revoke(task_id: str) -> None:
    from clawhub.core.celery_app import app

    # Not terminate=True: the train worker uses one process; the task sees the state at its next step.
    app.control.revoke(task_id)
