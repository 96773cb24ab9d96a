"""Reads for training: a tenant's settings and effective config, runs, a run's claimed samples and the eval
gate's held-out set, what each turn taught (the conversation page) and each member's weight in a group's
adapter (the group page)."""

from collections import Counter
from dataclasses import dataclass
from typing import Any

from django.conf import settings
from django.db.models import Q, QuerySet
from django.utils import timezone

from clawhub.adapters.models import AdapterVersion
from clawhub.conversations.models import Turn
from clawhub.feedback.models import ExplicitFeedback, Judgment
from clawhub.groups.models import Group
from clawhub.groups.selectors import group_members
from clawhub.review import flags
from clawhub.review.consensus import member_standings
from clawhub.review.models import Sample
from clawhub.review.selectors import review_policy_for
from clawhub.tenants.models import Tenant
from clawhub.training.models import Method, TrainingRun, TrainingSettings
from clawhub.training.schema import overrides_schema


def training_settings_for(*, tenant: Tenant) -> TrainingSettings:
    """The tenant's settings, or an unsaved row with the defaults."""
    return TrainingSettings.objects.filter(tenant=tenant).first() or TrainingSettings(
        tenant=tenant, method=Method.COMBINE
    )


def batch_size_for(ts: TrainingSettings) -> int:
    return ts.batch_size or settings.CLAWHUB_TRAINING_BATCH_SIZE


def backend_for(ts: TrainingSettings) -> str:
    return ts.backend or settings.CLAWHUB_TRAIN_BACKEND


def effective_config(ts: TrainingSettings) -> dict[str, Any]:
    """Site defaults, then the tenant's overrides, then its method: a plain dict TrainConfig accepts.

    Of the overrides only what a tenant may set counts: one stored before that rule (a ``device``, a
    ``dtype``) must not move the resident base model of every tenant's runs."""
    tenant_fields = overrides_schema()["properties"]
    overrides = {name: value for name, value in (ts.overrides or {}).items() if name in tenant_fields}
    return {**settings.CLAWHUB_TRAIN_DEFAULTS, **overrides, "method": ts.method}


def runs_for_tenant(*, tenant: Tenant) -> QuerySet[TrainingRun]:
    return (
        TrainingRun.objects.filter(tenant=tenant)
        .select_related("started_by", "adapter_version", "parent_version")
        .order_by("-created_at", "-id")
    )


def open_run_for_tenant(*, tenant: Tenant) -> TrainingRun | None:
    return TrainingRun.objects.filter(tenant=tenant, state__in=TrainingRun.OPEN_STATES).first()


def run_get(*, run_id: int) -> TrainingRun | None:
    """A run by id for a view; the view checks access to its tenant (tenants.access)."""
    return (
        TrainingRun.objects.select_related("started_by", "adapter_version", "parent_version")
        .filter(pk=run_id)
        .first()
    )


def run_for_task(*, run_id: int) -> TrainingRun | None:
    return (
        TrainingRun.objects.select_related("tenant", "parent_version", "adapter_version")
        .filter(pk=run_id)
        .first()
    )


def run_for_version(*, version) -> TrainingRun | None:
    """The run that trained an adapter version (None for a version made otherwise, e.g. by hand)."""
    return TrainingRun.objects.filter(adapter_version=version).first()


def runs_in_pass(*, task_id: str) -> list[TrainingRun]:
    """Runs a multi-tenant pass run by this train task took in (still running: a redelivered task finds
    them again)."""
    return list(
        TrainingRun.objects.select_related("tenant", "parent_version", "adapter_version")
        .filter(state=TrainingRun.State.RUNNING, remote_ids__pass_task=task_id)
        .order_by("created_at", "pk")
    )


def runs_ready_for_pass(*, base_model: str, exclude_tenant_id: int, limit: int) -> list[TrainingRun]:
    """Queued local runs on this base model that no task has taken yet, oldest first: what a multi-tenant
    pass may take in besides the run its task was sent for."""
    return list(
        TrainingRun.objects.filter(
            state=TrainingRun.State.QUEUED, backend="local", base_model=base_model, attempts=0
        )
        .exclude(tenant_id=exclude_tenant_id)
        .order_by("created_at", "pk")[:limit]
    )


def run_tokens(*, runs: list[TrainingRun]) -> dict[int, int]:
    """Prompt + reply tokens of each run's batch (its trained samples, not the held-out ones) as the gateway
    counted them: what the run adds to a multi-tenant pass. One query for all the runs."""
    ids = {i for run in runs for i in run.sample_ids}
    per_sample = {
        pk: prompt + reply
        for pk, prompt, reply in Sample.objects.filter(pk__in=ids).values_list(
            "pk", "turn__prompt_tokens", "turn__completion_tokens"
        )
    }
    return {run.pk: sum(per_sample.get(i, 0) for i in run.sample_ids) for run in runs}


def samples_of_run(*, run: TrainingRun) -> list[Sample]:
    """The run's claimed samples in the order it claimed them (the trainer's batch order, which a resumed run
    must repeat). A sample its user deleted since is left out."""
    by_id = {
        s.pk: s
        for s in run.samples.filter(pk__in=run.sample_ids)
        .exclude(state=Sample.State.DELETED)
        .select_related("turn", "judgment")
    }
    return [by_id[i] for i in run.sample_ids if i in by_id]


def heldout_samples(*, tenant: Tenant, limit: int) -> list:
    """The eval gate's held-out set: the tenant's judged turns that runs held back from their batches (never
    trained on), still approved and not deleted by their users, newest first."""
    # Only the slice of runs that succeeded, and only samples still claimed by that run: a failed run's
    # held-out samples went back to the pool and may have been trained since.
    held = Q(pk__in=[])
    for run_id, heldout in TrainingRun.objects.filter(
        tenant=tenant, state=TrainingRun.State.SUCCEEDED
    ).values_list("pk", "heldout_ids"):
        if heldout:
            held |= Q(training_run_id=run_id, pk__in=heldout)
    return list(
        Sample.objects.filter(held, tenant=tenant, state=Sample.State.APPROVED)
        .select_related("turn", "judgment")
        .order_by("-created_at", "-id")[: max(limit, 0)]
    )


# --- lineage: what blocks a tenant's next run, and where every approved sample stands ---------------------


def version_in_flight(*, tenant: Tenant):
    """The tenant's candidate that is still on its way through the gate and the switch (not one a pin holds
    back): the next run waits behind it, so that it trains from whatever that candidate becomes."""
    return (
        AdapterVersion.objects.filter(
            tenant=tenant,
            state__in=[AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING],
            held_at__isnull=True,
        )
        .order_by("version")
        .first()
    )


def samples_held_back(*, tenant: Tenant) -> dict[int, str]:
    """Approved, unclaimed samples that automatic runs no longer claim because the runs that claimed them
    timed out CLAWHUB_TRAIN_MAX_TIMEOUTS times, with the reason shown to the tenant's admins. A run started
    by hand still takes them (e.g. after the time limit was raised)."""
    limit = settings.CLAWHUB_TRAIN_MAX_TIMEOUTS
    if limit <= 0:
        return {}
    timeouts: Counter[int] = Counter()
    for ids in TrainingRun.objects.filter(
        tenant=tenant, state=TrainingRun.State.FAILED, failure=TrainingRun.Failure.TIMEOUT
    ).values_list("sample_ids", flat=True):
        timeouts.update(ids or [])
    over = [i for i, n in timeouts.items() if n >= limit]
    if not over:
        return {}
    waiting = Sample.objects.filter(
        pk__in=over,
        tenant=tenant,
        state=Sample.State.APPROVED,
        training_run_id__isnull=True,
        trained_at__isnull=True,
    ).values_list("pk", flat=True)
    return {
        pk: f"its training runs timed out {timeouts[pk]} times: automatic runs skip it; start a run by hand "
        "to try again"
        for pk in waiting
    }


def lineage_of(*, tenant: Tenant) -> list:
    """The active version and its ancestors, newest first: what the tenant is served was trained on the
    samples of exactly these versions' runs."""
    chain = []
    version = AdapterVersion.objects.filter(tenant=tenant, state=AdapterVersion.State.ACTIVE).first()
    seen = set()
    while version is not None and version.pk not in seen:
        seen.add(version.pk)
        chain.append(version)
        version = version.parent
    return chain


def sample_standing(*, tenant: Tenant) -> dict[int, str]:
    """Where each approved sample of the tenant stands: "in vN" (trained into a version the active one
    descends from), "waiting: …", "held out: …", "dropped: …", "rejected: …", or "lost" — which must never
    happen (feedback is never dropped without a recorded reason)."""
    lineage = {v.pk: v for v in lineage_of(tenant=tenant)}
    runs = {r.pk: r for r in TrainingRun.objects.filter(tenant=tenant).select_related("adapter_version")}
    held = samples_held_back(tenant=tenant)
    standing: dict[int, str] = {}
    for sample in Sample.objects.filter(tenant=tenant, state=Sample.State.APPROVED):
        run = runs.get(sample.training_run_id)  # type: ignore[arg-type]  # None: not claimed, no run
        if run is None:
            why = held.get(sample.pk, "the next batch")
            standing[sample.pk] = f"waiting: {why}"
            continue
        if sample.pk in (run.heldout_ids or []):
            standing[sample.pk] = "held out: the eval gate's held-out slice"
            continue
        if run.is_open:
            standing[sample.pk] = f"waiting: claimed by run {run.pk} ({run.state})"
            continue
        dropped = {str(d.get("sample_id")): d.get("reason") for d in run.dropped or []}
        if str(sample.pk) in dropped:
            standing[sample.pk] = f"dropped: {dropped[str(sample.pk)]}"
            continue
        version = run.adapter_version
        if version is None:
            standing[sample.pk] = "lost"
        elif version.pk in lineage:
            standing[sample.pk] = f"in v{version.version}"
        elif version.state in (AdapterVersion.State.CANDIDATE, AdapterVersion.State.EVALUATING):
            why = "held: the adapter is pinned" if version.held_at else "being evaluated and promoted"
            standing[sample.pk] = f"waiting: v{version.version} {why}"
        elif version.state == AdapterVersion.State.REJECTED:
            standing[sample.pk] = f"rejected: v{version.version}: {version.decision_reason or 'rejected'}"
        else:
            standing[sample.pk] = "lost"  # trained into a version that was retired outside the lineage
    return standing


def learning_for_turns(*, turns: list[Turn]) -> dict[int, dict[str, Any]]:
    """Per turn id, what the turn taught: its judgment, the person's own rating, its sample (review state,
    flags, who decided), the training run that claimed it and whether that run held it out. A few queries for
    a whole page of turns."""
    ids = [t.pk for t in turns]
    judgments = {j.turn_id: j for j in Judgment.objects.filter(turn_id__in=ids)}
    explicit = {f.turn_id: f for f in
                ExplicitFeedback.objects.filter(turn_id__in=ids).select_related("rated_by")}
    samples = {s.turn_id: s for s in Sample.objects.filter(turn_id__in=ids).select_related("decided_by")}
    runs = TrainingRun.objects.in_bulk({s.training_run_id for s in samples.values() if s.training_run_id})
    learned = {}
    for turn_id in ids:
        judgment, sample = judgments.get(turn_id), samples.get(turn_id)
        judged = judgment is not None and judgment.status == Judgment.Status.OK
        run = runs.get(sample.training_run_id) if sample and sample.training_run_id else None
        learned[turn_id] = {
            "judgment": judgment,
            "explicit": explicit.get(turn_id),
            "sample": sample,
            "run": run,
            # Claimed by the run only to check its version at the gate: never trained on.
            "held_out": run is not None and sample.pk in (run.heldout_ids or []),  # type: ignore[union-attr]  # a run: a sample
            # What training takes from the turn: the sample's reward, else the judge's.
            "effective_reward": sample.reward if sample else (judgment.reward if judged else None),  # type: ignore[union-attr]  # judged: a judgment
        }
    return learned


# --- members' influence -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class MemberInfluence:
    """One member's weight in the group adapter: their share of the advantage mass of each of the last
    versions (oldest first; None where they had no sample in it), the smallest loss weight the influence cap
    gave their samples, and, over the review guards' window, their flagged and rejected samples and where the
    consensus guard stands with them now (review.consensus.member_standings; "" with no styled sample)."""

    user: Any
    shares: list[float | None]
    min_weight: float | None
    flagged: int
    consensus: str  # the latest consensus guard's reason for this member, or ""
    rejected: int
    standing: str = ""


def group_member_influence(*, group: Group, versions: int = 5) -> tuple[list[int], list[MemberInfluence]]:
    """(the version numbers, oldest first; a row per current member) for the group page. A version's shares
    are each member's sum of loss weight x advantage mass over its run's samples, divided by the run's total
    (training.influence)."""
    tenant = group.tenant
    runs = list(TrainingRun.objects.filter(tenant=tenant, state=TrainingRun.State.SUCCEEDED,
                                           adapter_version__isnull=False)
                .select_related("adapter_version").order_by("-created_at", "-id")[:versions])[::-1]
    mass: dict[tuple[int, int], float] = {}
    weight: dict[int, float] = {}
    rows = (Sample.objects.filter(tenant=tenant, training_run_id__in=[r.pk for r in runs])
            .values_list("training_run_id", "user_id", "train_weight", "advantage_mass"))
    for run_id, user_id, w, m in rows:
        mass[run_id, user_id] = mass.get((run_id, user_id), 0.0) + w * m
        weight[user_id] = min(weight.get(user_id, 1.0), w)
    totals = {r.pk: sum(v for (run, _), v in mass.items() if run == r.pk) for r in runs}
    policy = review_policy_for(tenant=tenant)
    since = timezone.now() - policy.outlier_window
    standings = member_standings(tenant=tenant, policy=policy)
    recent = (Sample.objects.filter(tenant=tenant, created_at__gte=since)
              .values_list("user_id", "state", "flags"))
    flagged: dict[int, int] = {}
    rejected: dict[int, int] = {}
    consensus: dict[int, str] = {}
    for user_id, state, sample_flags in recent.order_by("created_at", "id"):
        codes = {f.get("code"): f.get("detail", "") for f in sample_flags or [] if isinstance(f, dict)}
        if codes.keys() & {flags.CONSENSUS, flags.MEMBER_OUTLIER}:
            flagged[user_id] = flagged.get(user_id, 0) + 1
        if flags.CONSENSUS in codes:
            consensus[user_id] = codes[flags.CONSENSUS]
        if state == Sample.State.REJECTED:
            rejected[user_id] = rejected.get(user_id, 0) + 1
    members = [
        MemberInfluence(
            user=m.user,
            shares=[mass[r.pk, m.user_id] / totals[r.pk] if totals[r.pk] and (r.pk, m.user_id) in mass
                    else None for r in runs],
            min_weight=weight.get(m.user_id),
            flagged=flagged.get(m.user_id, 0),
            consensus=consensus.get(m.user_id, ""),
            rejected=rejected.get(m.user_id, 0),
            standing=standings[m.user_id].state if m.user_id in standings else "",
        )
        for m in group_members(group=group)
    ]
    return [r.adapter_version.version for r in runs], members  # type: ignore[union-attr]  # succeeded: a version
