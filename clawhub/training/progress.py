"""Reads behind the live progress of a training run: where it is (step, loss, samples, a percentage of the
planned steps) and, in words, what happens next — training, then the promotion gate, then the switch and the
old version draining. The run page polls it (``training.views.run_progress``)."""

from typing import Any

from clawhub.adapters.models import AdapterVersion
from clawhub.training.models import TrainingRun

# Phases in the order a run goes through them; the page draws them as a row of steps.
PHASES = ("queued", "training", "evaluating", "promoting", "serving")


def planned_steps(config: dict, samples: int) -> int | None:
    """Optimizer steps a run will take, as the trainer plans them (TrainConfig: ``epochs`` passes of
    ``mini_batches`` steps, or of one step per ``micro_batch_size * grad_accum`` samples); None when the
    stored config is not a valid one."""
    from workers.trainer.backend import TrainConfig  # plain dataclasses: no torch is imported

    try:
        return max(1, TrainConfig.from_dict(config).planned_steps(samples))
    except (TypeError, ValueError):
        return None


def _phase(run: TrainingRun, version: AdapterVersion | None) -> tuple[str, str]:
    state = run.state
    if state == TrainingRun.State.QUEUED:
        return "queued", "Waiting for a train worker; then it trains on the claimed samples."
    if state == TrainingRun.State.RUNNING:
        return "training", "Training; next, the promotion gate scores the new version on held-out turns."
    if state in (TrainingRun.State.FAILED, TrainingRun.State.CANCELLED):
        return state, f"The run {state}; its samples went back to the pool for the next run."
    if version is None:
        return "evaluating", "Trained; the new version is being saved for the promotion gate."
    if version.state == AdapterVersion.State.CANDIDATE:
        if version.held_at:
            return "promoting", f"v{version.version} passed the gate and is held: the adapter is pinned."
        return "evaluating", f"v{version.version} waits for the promotion gate."
    if version.state == AdapterVersion.State.EVALUATING:
        return "evaluating", f"The promotion gate is scoring v{version.version} against its parent."
    if version.state == AdapterVersion.State.REJECTED:
        why = version.decision_reason or version.decision
        return "rejected", f"The gate rejected v{version.version}: {why}."
    if version.state == AdapterVersion.State.ACTIVE:
        draining = AdapterVersion.objects.filter(tenant_id=run.tenant_id, state=AdapterVersion.State.RETIRED,
                                                 drain_until__isnull=False, unloaded_at__isnull=True)
        names = ", ".join(f"v{v}" for v in draining.values_list("version", flat=True))
        tail = f"; {names} drains (requests on it finish, then it is unloaded)." if names else "."
        return "serving", f"v{version.version} is promoted and answers new requests{tail}"
    return "serving", f"v{version.version} was served and is now {version.display_state}."


def run_progress(*, run: TrainingRun) -> dict[str, Any]:
    """Plain data for the run page and its poller."""
    samples = len(run.sample_ids or [])
    planned = planned_steps(run.config or {}, samples) if samples else None
    version = run.adapter_version
    phase, next_text = _phase(run, version)
    if run.state == TrainingRun.State.SUCCEEDED:
        percent = 100
    elif planned:
        percent = min(99 if run.is_open else 100, round(100 * run.step / planned))
    else:
        percent = None
    last = (run.metrics or [])[-1] if run.metrics else {}
    return {
        "run": run.pk,
        "state": run.state,
        "phase": phase,
        "phases": list(PHASES),
        "next": next_text,
        "step": run.step,
        "planned_steps": planned,
        "percent": percent,
        "loss": run.loss,
        "mean_reward": run.mean_reward,
        "samples": samples,
        "step_samples": last.get("samples"),
        "tokens": run.tokens,
        "seconds": round(run.seconds or 0.0, 1),
        "version": version.version if version else None,
        "version_state": version.display_state if version else None,
        # Whether the run can still be cancelled: the page hides its Cancel button once it cannot.
        "open": run.is_open,
        # The poller stops once nothing more can change.
        "done": phase in ("serving", "rejected", "failed", "cancelled"),
    }
