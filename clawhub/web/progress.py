"""Reads behind the dashboard's "adapter progress" section: for each adapter a user can see, its versions over
time with their eval scores (as SVG chart geometry), the training run in progress, and the feedback that fed
each version (the samples a run claimed: ``review.Sample.training_run_id`` -> run -> version).

Group adapters show counts only: the feedback texts are other members' words. Training lives in its own app;
without it installed the section still shows versions and their feedback (a version records its run id in
``metrics["training_run"]``).
"""

from __future__ import annotations

import base64
from dataclasses import dataclass, field
from pathlib import Path

from django.apps import apps
from django.conf import settings
from django.db.models import Count, Q

from clawhub.accounts.models import User
from clawhub.adapters.models import AdapterVersion
from clawhub.adapters.selectors import tenants_for_user
from clawhub.core.charts import SvgChart, svg_chart
from clawhub.review.models import Sample
from clawhub.tenants.models import Tenant
from clawhub.tenants.selectors import tenant_label

VERSIONS_SHOWN = 20
EXAMPLES_PER_VERSION = 3
BENCH_PLOT_MAX_BYTES = 2 * 1024 * 1024


@dataclass
class Feedback:
    positive: int = 0
    negative: int = 0
    hinted: int = 0
    held_out: int = 0  # claimed by the run to check it at the gate, not trained on
    examples: list[tuple[int, str]] = field(default_factory=list)  # (reward, the user's next message)

    @property
    def total(self) -> int:
        return self.positive + self.negative


@dataclass
class VersionRow:
    version: AdapterVersion
    run_id: int | None
    feedback: Feedback | None


@dataclass
class RunProgress:
    run: object  # training.TrainingRun
    samples: int
    planned_steps: int | None

    @property
    def percent(self) -> int | None:
        if not self.planned_steps:
            return None
        return min(100, round(100 * self.run.step / self.planned_steps))


@dataclass
class Stalled:
    """What keeps feedback from training that nothing else on the page says: samples waiting for a reviewer,
    and replies cut at max_tokens (never judged unless the tenant includes them)."""

    pending_review: int
    recent: int  # the newest main turns looked at
    cut: int  # of those, how many stopped at max_tokens
    asked: int | None  # the output limit those cut turns asked for most often
    length_included: bool

    @property
    def mostly_cut(self) -> bool:
        return not self.length_included and self.recent >= 3 and self.cut * 2 >= self.recent


def stalled_for(*, tenant: Tenant) -> Stalled:
    from clawhub.conversations.selectors import conversation_settings_for, recent_length_cuts
    from clawhub.review.selectors import pending_review_count

    recent, cut, asked = recent_length_cuts(tenant_id=tenant.pk)
    return Stalled(pending_review=pending_review_count(tenant=tenant), recent=recent, cut=cut, asked=asked,
                   length_included=conversation_settings_for(tenant_id=tenant.pk).include_length_turns)


@dataclass
class TenantProgress:
    tenant: Tenant
    label: str
    versions: list[VersionRow]  # newest first
    chart: SvgChart | None
    run: RunProgress | None
    trainable: int
    batch_size: int | None
    stalled: Stalled | None = None

    @property
    def active(self) -> AdapterVersion | None:
        active = AdapterVersion.State.ACTIVE
        return next((r.version for r in self.versions if r.version.state == active), None)


def _run_ids(versions: list[AdapterVersion]) -> dict[int, int]:
    """version id -> training run id."""
    found = {v.pk: int(v.metrics["training_run"]) for v in versions
             if isinstance(v.metrics, dict) and str(v.metrics.get("training_run", "")).isdigit()}
    if apps.is_installed("clawhub.training"):
        from clawhub.training.models import TrainingRun

        found.update(TrainingRun.objects.filter(adapter_version__in=versions)
                     .values_list("adapter_version_id", "pk"))
    return found


def _not_trained(run_ids: list[int]) -> tuple[set[int], set[int]]:
    """The samples the runs claimed but did not train on: the gate's held-out slice, and those dropped."""
    held_out: set[int] = set()
    dropped: set[int] = set()
    if apps.is_installed("clawhub.training"):
        from clawhub.training.models import TrainingRun

        for heldout_ids, dropped_rows in TrainingRun.objects.filter(pk__in=run_ids).values_list(
                "heldout_ids", "dropped"):
            held_out.update(heldout_ids or [])
            dropped.update(d["sample_id"] for d in dropped_rows or [] if "sample_id" in d)
    return held_out, dropped


def _feedback(tenant: Tenant, run_ids: list[int], *, with_texts: bool) -> dict[int, Feedback]:
    from clawhub.review.services import next_state_text

    held_out, dropped = _not_trained(run_ids)
    claimed = Sample.objects.filter(tenant=tenant, training_run_id__in=run_ids).exclude(
        state=Sample.State.DELETED)
    samples = claimed.exclude(pk__in=held_out | dropped)
    rows = (samples.values("training_run_id")
            .annotate(pos=Count("id", filter=Q(reward__gt=0)), neg=Count("id", filter=Q(reward__lt=0)),
                      hinted=Count("id", filter=Q(has_hint=True))))
    out = {r["training_run_id"]: Feedback(positive=r["pos"], negative=r["neg"], hinted=r["hinted"])
           for r in rows}
    for run_id, count in (claimed.filter(pk__in=held_out).values("training_run_id")
                          .annotate(n=Count("id")).values_list("training_run_id", "n")):
        out.setdefault(run_id, Feedback()).held_out = count
    if with_texts and out:
        texts = samples.order_by("training_run_id", "reward", "id").values_list(
            "training_run_id", "reward", "turn__next_state")
        for run_id, reward, next_state in texts:
            feedback = out[run_id]
            # Corrections first: they say the most about what the version was taught.
            if len(feedback.examples) < EXAMPLES_PER_VERSION and next_state:
                text = next_state_text(next_state).strip()
                if text:
                    feedback.examples.append((reward, text[:240]))
    return out


def _open_run(tenant: Tenant) -> RunProgress | None:
    if not apps.is_installed("clawhub.training"):
        return None
    from clawhub.training.selectors import open_run_for_tenant

    run = open_run_for_tenant(tenant=tenant)
    if run is None:
        return None
    from clawhub.training.progress import planned_steps

    return RunProgress(run=run, samples=len(run.sample_ids or []),
                       planned_steps=planned_steps(run.config or {}, len(run.sample_ids or [])))


def _batch(tenant: Tenant) -> tuple[int, int | None]:
    from clawhub.review.selectors import trainable_count

    batch_size = None
    if apps.is_installed("clawhub.training"):
        from clawhub.training.selectors import batch_size_for, training_settings_for

        batch_size = batch_size_for(training_settings_for(tenant=tenant))
    return trainable_count(tenant=tenant), batch_size


def tenant_progress(*, tenant: Tenant, viewer: User) -> TenantProgress:
    versions = list(AdapterVersion.objects.filter(tenant=tenant).order_by("-version")[:VERSIONS_SHOWN])
    run_of = _run_ids(versions)
    own = tenant.kind == Tenant.Kind.USER and tenant.user_id == viewer.pk
    feedback = _feedback(tenant, list(set(run_of.values())), with_texts=own)
    rows = [VersionRow(version=v, run_id=run_of.get(v.pk), feedback=feedback.get(run_of.get(v.pk, -1)))
            for v in versions]
    scored = [(f"v{v.version}", v.eval_score,
               f"v{v.version} ({v.display_state}, {v.created_at:%Y-%m-%d %H:%M}): eval {v.eval_score:.2f}",
               v.display_state)
              for v in reversed(versions) if v.eval_score is not None]
    trainable, batch_size = _batch(tenant)
    return TenantProgress(tenant=tenant, label=tenant_label(tenant), versions=rows, chart=svg_chart(scored),
                          run=_open_run(tenant), trainable=trainable, batch_size=batch_size,
                          stalled=stalled_for(tenant=tenant))


def adapter_progress(*, user: User) -> list[TenantProgress]:
    """Every adapter the user can see (their own, their groups'), in the training pages' order."""
    return [tenant_progress(tenant=t, viewer=user) for t in tenants_for_user(user=user)]


def bench_plot_path() -> Path:
    return Path(settings.DATA_DIR) / "bench" / "personas.png"


def bench_plot_data_uri() -> str | None:
    """The last persona benchmark's plot (written by ``manage.py bench_personas``) as a data: URI, so the
    dashboard needs no file-serving route for it. Aggregate compliance only: no user's data is in it."""
    path = bench_plot_path()
    try:
        data = path.read_bytes() if path.stat().st_size <= BENCH_PLOT_MAX_BYTES else b""
    except OSError:
        return None
    if not data.startswith(b"\x89PNG"):
        return None
    return "data:image/png;base64," + base64.b64encode(data).decode()
