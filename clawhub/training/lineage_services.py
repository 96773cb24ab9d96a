"""Writes that keep a tenant's lineage whole on the samples' side: nothing forgotten, nothing dropped without
a reason. The eval gate's decision is recorded here, since a rejected candidate's samples go back to the pool
once; a version that will never be served (its parent was retired while it trained or was gated, or its
promotion never completed) is rejected with the samples its run trained back in the pool, so that their
feedback trains into the next version; the sweeper re-drives what a lost worker forgot. The hot swap these
protect is clawhub/adapters/services.py; what needs no run is clawhub/adapters/lineage_services.py."""

from datetime import timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from clawhub.accounts.audit import audit_record_for_tenant
from clawhub.adapters import evaluation
from clawhub.adapters.lineage_services import adapter_unload_everywhere
from clawhub.adapters.models import AdapterVersion, LoadedAdapter
from clawhub.core import tasks
from clawhub.training.models import TrainingRun
from clawhub.training.services import run_samples_requeue, run_samples_requeue_once


def adapter_record_decision(*, version: AdapterVersion, decision: evaluation.Decision) -> bool:
    """Stores the gate's decision, its reason and its numbers on the version (its page shows them); a
    rejected candidate is done, and the samples it trained go back to the pool once
    (clawhub.training.services.run_samples_requeue_once: the reason says how many, and why any stay out).
    Returns whether it passed."""
    version.refresh_from_db()
    margin = decision.numbers.get("margin") or {}
    version.eval_score = margin.get("delta")
    version.baseline_score = None
    version.decision, version.decision_reason = decision.outcome, decision.reason
    version.metrics = {
        **version.metrics,
        "eval": {
            **decision.to_dict(),
            "passed": decision.passed,
            "baseline": {"version": version.parent.version if version.parent else None},
            "at": timezone.now().isoformat(),
        },
    }
    with transaction.atomic():
        if not decision.passed:
            version.state = AdapterVersion.State.REJECTED
        version.save(
            update_fields=["eval_score", "baseline_score", "decision", "decision_reason", "metrics", "state"]
        )
        run = TrainingRun.objects.filter(adapter_version=version).first()
        if not decision.passed and run is not None:
            requeued, kept = run_samples_requeue_once(run=run)
            version.decision_reason += _requeue_note(requeued, kept)
            version.save(update_fields=["decision_reason"])
    audit_record_for_tenant(
        actor=None,
        action="adapter.evaluated",
        target=version,
        tenant=version.tenant,
        passed=decision.passed,
        decision=decision.outcome,
        reason=decision.reason[:300],
    )
    return decision.passed


def _requeue_note(requeued: int, kept: int) -> str:
    note = f"; its {requeued} trained samples went back to the pool, to train once more" if requeued else ""
    if kept:
        note += (f"; {kept} samples stay out: they were in a batch the gate rejected before, and are retried "
                 "only once")
    return note


def adapter_reject_stale_parent(
    *, version: AdapterVersion, active: AdapterVersion | None
) -> AdapterVersion:
    """The version's parent was retired while it trained or was gated (a rollback, a held candidate promoted
    by hand): promoting it would drop the active version's feedback, so it is rejected and its samples train
    again into the next version."""
    parent = f"v{version.parent.version}" if version.parent else "the base model"
    return adapter_reject_out_of_lineage(
        version=version,
        decision="stale_parent",
        reason=f"its parent ({parent}) was retired while it trained or was evaluated"
        f"{f' (v{active.version} is active)' if active else ''}; its samples went back to the pool",
    )


def adapter_reject_out_of_lineage(*, version: AdapterVersion, decision: str, reason: str) -> AdapterVersion:
    """The version will never be promoted (its parent was retired while it trained, or its promotion failed
    too often): rejected with the reason on its page, its pre-loads removed, and the samples it trained
    returned to the pool, so their feedback trains into the next version instead of being lost."""
    with transaction.atomic():
        updated = AdapterVersion.objects.filter(
            pk=version.pk, state__in=[AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING]
        ).update(state=AdapterVersion.State.REJECTED, decision=decision, decision_reason=reason)
        version.refresh_from_db()
        if not updated:
            return version
        run = TrainingRun.objects.select_related("tenant").filter(adapter_version=version).first()
        requeued = run_samples_requeue(run=run, reason=reason) if run else 0
        audit_record_for_tenant(
            actor=None, action="adapter.rejected", target=version, tenant=version.tenant, decision=decision,
            reason=reason, requeued=requeued,
        )
    adapter_unload_everywhere(version)
    return version


def promotions_sweep(*, now=None) -> dict[str, list[str]]:
    """Periodic ("clawhub.train.sweep"): candidates whose promotion was never sent or never finished (a worker
    died between "succeeded" and "promote sent", a promotion gave up, an evaluation hung) are sent to the
    promote task again once they are stuck longer than CLAWHUB_PROMOTION_STUCK_SECONDS; after
    CLAWHUB_PROMOTION_MAX_REDRIVES they are rejected with their samples returned to the pool. Pre-loads of
    versions that will never be served are unloaded."""
    now = now or timezone.now()
    bound = now - timedelta(seconds=settings.CLAWHUB_PROMOTION_STUCK_SECONDS)
    done: dict[str, list[str]] = {"redriven": [], "given_up": [], "unloaded": []}
    stuck = AdapterVersion.objects.filter(
        state__in=[AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING], held_at__isnull=True
    ).select_related("tenant")
    for version in stuck:
        run = TrainingRun.objects.filter(adapter_version=version).first()
        if run is not None and run.state != TrainingRun.State.SUCCEEDED:
            continue  # still training (or the run failed: the version was never finished)
        since = version.evaluating_since or (run.finished_at if run else version.created_at)
        if since is None or since > bound:
            continue
        if version.redrives >= settings.CLAWHUB_PROMOTION_MAX_REDRIVES:
            reason = (
                f"promotion did not complete after {version.redrives + 1} attempts"
                + (f" (last error: {version.promotion_error[:300]})" if version.promotion_error else "")
                + "; its samples went back to the pool"
            )
            adapter_reject_out_of_lineage(version=version, decision="promotion_failed", reason=reason)
            done["given_up"].append(version.upstream_name)
            continue
        marked = AdapterVersion.objects.filter(pk=version.pk, redrives=version.redrives).update(
            redrives=version.redrives + 1, evaluating_since=now
        )
        if marked:
            tasks.enqueue_on_commit(tasks.PROMOTE, version.pk)
            done["redriven"].append(version.upstream_name)
    leftovers = LoadedAdapter.objects.filter(
        adapter_version__state=AdapterVersion.State.REJECTED
    ).select_related("adapter_version")
    for row in leftovers:
        adapter_unload_everywhere(row.adapter_version)  # type: ignore[arg-type]  # filtered on its state: set
        done["unloaded"].append(row.adapter_name)
    return done
