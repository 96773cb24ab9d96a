"""Promotion tasks: a new adapter version's lineage check, eval gate and promotion (or a rollback), on the
``train`` worker (the gate needs torch); unloading drained versions and the promotion sweep on the
``housekeeping`` queue."""

import logging
from typing import Any

from django.conf import settings

from clawhub.accounts.selectors import user_by_id
from clawhub.adapters import lineage_services
from clawhub.adapters import services as adapter_services
from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.selectors import active_adapter_for_tenant, adapter_is_pinned, adapter_version_by_id
from clawhub.adapters.serving import UpstreamUnavailable
from clawhub.core import tasks
from clawhub.training import lineage_services as training_lineage
from clawhub.training import services
from clawhub.training.selectors import heldout_samples, run_for_version
from workers.celery import app
from workers.tasks.training import train_sample
from workers.trainer.backend import TrainConfig

logger = logging.getLogger("workers.tasks.promotion")


@app.task(
    name=tasks.PROMOTE,
    queue=tasks.TRAIN_QUEUE,
    bind=True,
    acks_late=True,
    reject_on_worker_lost=True,
    ignore_result=True,
)
def promote(self, version_id: int, rollback: bool = False, actor_id: int | None = None) -> dict[str, Any]:
    """A new candidate: lineage check, eval gate, then promotion unless the tenant is pinned. ``rollback``:
    activate an earlier version (an owner, admin or staff member asked; no gate). Idempotent: an active
    version is done. When it is done with a candidate, the tenant's next batch (queued behind it) starts."""
    version = adapter_version_by_id(version_id=version_id)
    if version is None:
        return {"version": version_id, "outcome": "missing"}
    try:
        if rollback:
            actor = user_by_id(user_id=actor_id)
            adapter_services.adapter_activate(version=version, actor=actor, reason="rollback")
            return {"version": version_id, "outcome": "active"}
        if version.state not in (AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING):
            return {"version": version_id, "outcome": version.state}
        outcome = _promote_candidate(version)
    except UpstreamUnavailable as exc:
        retries = settings.CLAWHUB_PROMOTE_RETRIES
        if self.request.retries < retries:
            countdown = settings.CLAWHUB_PROMOTE_RETRY_BACKOFF * 2**self.request.retries
            raise self.retry(exc=exc, countdown=countdown, max_retries=retries) from None
        # Out of retries: no pre-load is left behind, the version waits for the sweeper.
        lineage_services.adapter_promotion_failed(version=version, error=str(exc))
        outcome = "promotion_failed"
    if outcome != "promotion_failed":
        services.runs_kick(tenant_ids=[version.tenant_id])
    return {"version": version_id, "outcome": outcome}


def _promote_candidate(version: AdapterVersion) -> str:
    if not lineage_services.adapter_parent_is_current(version=version):
        # The parent was retired while this version trained: no gate to run (checked again at the switch).
        active = active_adapter_for_tenant(tenant_id=version.tenant_id)
        training_lineage.adapter_reject_stale_parent(version=version, active=active)
        return "requeued"
    if not _gate(version):
        return "rejected"
    if adapter_is_pinned(tenant_id=version.tenant_id):
        adapter_services.adapter_hold(version=version)
        return "held"
    # The parent and the pin are read again under the tenant's lock at the switch: a rollback or a pin made
    # while the gate ran wins.
    try:
        version = adapter_services.adapter_activate(version=version)
    except adapter_services.ParentRetired as refused:
        version = training_lineage.adapter_reject_stale_parent(version=refused.version, active=refused.active)
    if version.state == AdapterVersion.State.REJECTED:
        return "requeued"
    return "active" if version.state == AdapterVersion.State.ACTIVE else "held"


def _gate(version: AdapterVersion) -> bool:
    """Scores candidate and parent on the tenant's held-out judged turns and canaries (here, on the train
    worker: it needs torch), decides by the stated rule, and records the decision on the version."""
    from clawhub.adapters.evaluation import decide
    from workers.trainer.gate import score_versions

    version = adapter_services.adapter_evaluation_start(version=version)
    run = run_for_version(version=version)
    limit = settings.CLAWHUB_GATE_MAX_SAMPLES
    samples = [train_sample(s) for s in heldout_samples(tenant=version.tenant, limit=limit)]
    parent = version.parent
    config = TrainConfig.from_dict(run.config if run else {})
    adapters = {"candidate": version.artifact_path, "parent": parent.artifact_path if parent else None}
    if parent is not None:
        adapters["base"] = None  # degeneration against the base too: drift must not compound across versions
    scores = score_versions(
        base_model=run.base_model if run else settings.CLAWHUB_TRAIN_BASE_MODEL,
        adapters=adapters,
        samples=samples,
        # The prompts as training saw them (it truncates at its max_seq_len, 32,768 tokens by default), on the
        # device and in the dtype of training's resident base (shared, not copied).
        max_seq_len=config.max_seq_len,
        device=config.device,
        dtype=config.dtype,
        fixed_only=("base",),
    )
    decision = decide(
        candidate=scores["candidate"].to_dict(),
        parent=scores["parent"].to_dict(),
        base=scores["base"].to_dict() if "base" in scores else None,
        rewards={str(s.sample_id): s.reward for s in samples if s.reward != 0},
        min_samples=settings.CLAWHUB_GATE_MIN_SAMPLES,
        confidence=settings.CLAWHUB_GATE_CONFIDENCE,
        resamples=settings.CLAWHUB_GATE_BOOTSTRAP,
    )
    decision.numbers["canaries"] = {
        "candidate": scores["candidate"].canaries[:2],
        "parent": scores["parent"].canaries[:2],
    }
    logger.info("gate %s: %s (%s)", version.upstream_name, decision.outcome, decision.reason)
    return training_lineage.adapter_record_decision(version=version, decision=decision)


@app.task(name=tasks.UNLOAD_DRAINED, queue=tasks.HOUSEKEEPING_QUEUE, ignore_result=True)
def unload_drained() -> list[str]:
    return adapter_services.adapter_unload_drained()


@app.task(name=tasks.PROMOTION_SWEEP, queue=tasks.HOUSEKEEPING_QUEUE, ignore_result=True)
def sweep() -> dict[str, list[str]]:
    """Periodic: re-drive stuck candidates and evaluations, give up on hopeless ones (samples back to the
    pool), unload pre-loads of versions that will never be served."""
    return training_lineage.promotions_sweep()
