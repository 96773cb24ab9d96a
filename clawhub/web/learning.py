"""Reads behind the learning page ("Is my model getting better?"): per tenant, the promotion gate's metric per
version with its interval, the share of positively judged turns per day, and the versions' timeline with
promotions, rejections and rollbacks — and one sentence that answers the question from them. Then the serving
version against what it was measured against, in words, with replies before and after from what is stored
(the gate's canary replies, and the user's own playground comparisons): nothing is generated to draw the page.

The gate's numbers are what ``training.lineage_services.adapter_record_decision`` stored on each version
(``metrics["eval"]["numbers"]["margin"]``: the change in preference margin over the parent on held-out judged
turns, with its bootstrap interval); nothing is recomputed here.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import date, datetime, timedelta
from xml.sax.saxutils import escape

from django.db.models import Count, Q
from django.db.models.functions import TruncDate
from django.utils import timezone

from clawhub.accounts.models import AuditLog
from clawhub.adapters.models import AdapterVersion
from clawhub.core.charts import FONT, Chart, Svg, bar_chart
from clawhub.feedback.models import ExplicitFeedback, Judgment
from clawhub.tenants.models import Tenant

DAYS = 30
_TIMELINE_ACTIONS = {
    "adapter.promoted": "promoted",
    "adapter.rolled_back": "rolled back to",
    "adapter.rollback_requested": "rollback asked for",
    "adapter.rejected": "rejected",
    "adapter.held": "held (the tenant is pinned)",
    "adapter.pinned": "pinned",
    "adapter.unpinned": "unpinned",
}


@dataclass
class GateRow:
    version: AdapterVersion
    delta: float | None
    low: float | None
    high: float | None
    confidence: float | None
    held_out: int | None


@dataclass
class Event:
    at: datetime
    version: int | None
    what: str
    kind: str  # the state class it is drawn with: active, rejected, retired, draining, candidate
    detail: str = ""


@dataclass
class Comparison:
    """The serving version (or the newest the gate judged) against its parent or the base model, in words."""

    version: AdapterVersion
    against: str  # "v2" or "the base model"
    figures: list[str]  # the gate's numbers, one plain sentence each
    canaries: list[tuple[str, str]]  # the same fixed prompt answered before (the parent) and after (this one)
    tried: list[tuple[str, str, str]]  # the user's playground comparisons: prompt, base reply, this version's


@dataclass
class Learning:
    tenant: Tenant
    verdict: str
    verdict_kind: str  # "better", "worse", "unsure", "none"
    gate: list[GateRow]
    gate_chart: Svg | None
    days: list[tuple[date, int, int, int]]  # day, positive, neutral, negative (judged main turns)
    days_chart: Chart | None
    timeline: list[Event] = field(default_factory=list)
    explicit: int = 0
    comparison: Comparison | None = None
    stalled: object = None  # web.progress.Stalled


Number = float | None


def _margin(version: AdapterVersion) -> tuple[Number, Number, Number, Number, int | None]:
    numbers = ((version.metrics or {}).get("eval") or {}).get("numbers") or {}
    margin = numbers.get("margin") or {}
    return (margin.get("delta"), margin.get("low"), margin.get("high"), numbers.get("confidence"),
            numbers.get("held_out"))


def interval_chart(rows: list[GateRow], *, width: int = 460, height: int = 220) -> Svg | None:
    """One point per evaluated version (its change in preference margin over its parent) with its interval
    as a whisker, a dashed line at 0: above it, the version made liked replies likelier than disliked ones."""
    rows = [r for r in rows if r.delta is not None]
    if not rows:
        return None
    values = [v for r in rows for v in (r.delta, r.low, r.high) if v is not None] + [0.0]
    top, bottom_v = max(values), min(values)
    pad = max(0.05, (top - bottom_v) * 0.1)
    top, bottom_v = top + pad, bottom_v - pad
    left, right, y0, y1 = 56, width - 16, 36, height - 36
    step = (right - left) / len(rows)

    def y(v: float) -> float:
        return y1 - (v - bottom_v) / (top - bottom_v) * (y1 - y0)

    parts = [f'<svg xmlns="http://www.w3.org/2000/svg" class="interval-chart" role="img" width="{width}" '
             f'height="{height}" viewBox="0 0 {width} {height}" {FONT} font-size="12">',
             "<title>Promotion gate: change in preference margin per version, with its interval</title>",
             "<desc>" + escape("; ".join(
                 f"v{r.version.version}: {r.delta:+.3f}"
                 + (f" [{r.low:+.3f}, {r.high:+.3f}]" if r.low is not None and r.high is not None else "")
                 + f" ({r.version.decision or r.version.state})" for r in rows)) + "</desc>",
             f'<line x1="{left}" x2="{right}" y1="{y(0):.1f}" y2="{y(0):.1f}" stroke="#9ca3af" '
             'stroke-dasharray="4 3"/>',
             f'<text x="{left - 6}" y="{y(0):.1f}" text-anchor="end" dominant-baseline="middle" '
             'fill="#6b7078">0</text>',
             f'<text x="{left - 6}" y="{y0:.1f}" text-anchor="end" dominant-baseline="middle" '
             f'fill="#6b7078">{top:+.2f}</text>',
             f'<text x="{left - 6}" y="{y1:.1f}" text-anchor="end" dominant-baseline="middle" '
             f'fill="#6b7078">{bottom_v:+.2f}</text>',
             f'<text x="{(left + right) / 2:.0f}" y="16" text-anchor="middle" font-weight="600">'
             "Preference margin vs the parent (higher is better)</text>"]
    for i, r in enumerate(rows):
        x = left + step * (i + 0.5)
        passed = r.version.state in (AdapterVersion.State.ACTIVE, AdapterVersion.State.RETIRED)
        color = "#009e73" if passed else ("#d55e00" if r.version.state == AdapterVersion.State.REJECTED
                                          else "#e69f00")
        if r.low is not None and r.high is not None:
            parts.append(f'<line x1="{x:.1f}" x2="{x:.1f}" y1="{y(r.high):.1f}" y2="{y(r.low):.1f}" '
                         f'stroke="{color}" stroke-width="2"/>')
            for v in (r.low, r.high):
                parts.append(f'<line x1="{x - 6:.1f}" x2="{x + 6:.1f}" y1="{y(v):.1f}" y2="{y(v):.1f}" '
                             f'stroke="{color}" stroke-width="2"/>')
        tip = escape(f"v{r.version.version}: {r.delta:+.3f}, {r.version.decision or r.version.state}")
        parts.append(f'<circle cx="{x:.1f}" cy="{y(r.delta):.1f}" r="5" fill="{color}"><title>{tip}</title>'
                     "</circle>")
        parts.append(f'<text x="{x:.1f}" y="{height - 16}" text-anchor="middle">v{r.version.version}</text>')
    parts.append("</svg>")
    return Svg("".join(parts))


def _days(tenant: Tenant, *, since: datetime) -> list[tuple[date, int, int, int]]:
    rows = (Judgment.objects.filter(tenant=tenant, status=Judgment.Status.OK, created_at__gte=since)
            .annotate(day=TruncDate("created_at")).values("day")
            .annotate(pos=Count("id", filter=Q(reward__gt=0)), neu=Count("id", filter=Q(reward=0)),
                      neg=Count("id", filter=Q(reward__lt=0)))
            .order_by("day"))
    return [(r["day"], r["pos"], r["neu"], r["neg"]) for r in rows]


def _timeline(tenant: Tenant, versions: list[AdapterVersion]) -> list[Event]:
    by_id = {str(v.pk): v for v in versions}
    events = [Event(v.created_at, v.version, "trained", "candidate",
                    f"from {'v' + str(v.parent.version) if v.parent_id else 'the base model'}")
              for v in versions]
    events += [Event(datetime.fromisoformat(v.metrics["eval"]["at"]), v.version,
                     f"gate: {v.decision.replace('_', ' ')}",
                     "rejected" if v.state == "rejected" else "evaluating", v.decision_reason)
               for v in versions if v.decision and isinstance((v.metrics or {}).get("eval"), dict)
               and v.metrics["eval"].get("at")]
    audit = AuditLog.objects.filter(target_type="adapterversion", target_id__in=list(by_id),
                                    action__in=list(_TIMELINE_ACTIONS)).select_related("actor")
    for row in audit:
        version = by_id.get(row.target_id)
        kind = {"adapter.promoted": "active", "adapter.rolled_back": "draining",
                "adapter.rejected": "rejected"}.get(row.action, "retired")
        who = f"by {row.actor.email}" if row.actor_id else ""
        events.append(Event(row.created_at, version.version if version else None,
                            _TIMELINE_ACTIONS[row.action], kind, who))
    return sorted(events, key=lambda e: (e.at, e.version or 0), reverse=True)


def _verdict(gate: list[GateRow], days: list[tuple[date, int, int, int]]) -> tuple[str, str]:
    if not gate:
        if days:
            return ("Not yet known: no version has been through the promotion gate. Turns are being judged "
                    "(below); a first version is trained once enough feedback is approved."), "none"
        return "Not yet known: no turns have been judged yet.", "none"
    last = gate[-1]
    if last.delta is None:  # the gate decided without a margin (too few held-out turns to measure one)
        return _unmeasured_verdict(last)
    pct = f"{last.confidence:.0%} " if last.confidence else ""
    span = (f" ({pct}interval [{last.low:+.3f}, {last.high:+.3f}])"
            if last.low is not None and last.high is not None else "")
    v = f"v{last.version.version}"
    if last.low is not None and last.low > 0:
        return (f"Yes: {v} made the replies you liked likelier than the ones you corrected, by "
                f"{last.delta:+.3f}{span} on held-out turns, compared with its parent."), "better"
    if last.high is not None and last.high < 0:
        return (f"No: {v} moved the wrong way ({last.delta:+.3f}{span}); the gate "
                f"{'rejected it' if last.version.state == 'rejected' else 'recorded it'}."), "worse"
    return (f"Not clear yet: {v} changed the margin by {last.delta:+.3f}{span}; the interval still includes "
            "no change. More judged turns narrow it."), "unsure"


def _unmeasured_verdict(row: GateRow) -> tuple[str, str]:
    v = f"v{row.version.version}"
    if row.version.state == AdapterVersion.State.REJECTED:
        return f"No: the promotion gate rejected {v} ({row.version.decision_reason}).", "worse"
    return (f"Not measured yet: {v} passed the promotion gate without a measured change, as too few judged "
            f"turns were held out to measure one (the gate: {row.version.decision_reason}). More judged "
            "turns let the gate measure the next version."), "unsure"


def _pct(value) -> str:
    return f"{value:.0%}" if isinstance(value, int | float) else "—"


def _figures(n: dict, against: str, base_is_parent: bool) -> list[str]:
    """The gate's numbers (adapters.evaluation.decide's ``numbers``) as sentences a user can read."""
    figures = []
    held = n.get("held_out")
    if held is not None:
        split = (f" ({n['positives']} with a reply you liked, {n.get('negatives', 0)} with one you "
                 f"corrected, {n.get('hinted', 0)} with a hint)") if "positives" in n else ""
        figures.append(f"Scored on {held} of your judged turns that no version was trained on{split}.")
    margin = n.get("margin")
    if margin and margin.get("delta") is not None:
        low, high = margin.get("low"), margin.get("high")
        what = ("a clear gain" if low is not None and low > 0 else
                "a loss" if high is not None and high < 0 else "no measurable change yet")
        span = f" ({_pct(n.get('confidence'))} interval {low:+.3f} to {high:+.3f})" if low is not None else ""
        figures.append(
            f"Compared with {against}, it makes the replies you liked likelier relative to the ones you "
            f"corrected by {margin['delta']:+.3f} nats per token{span}: {what}.")
    elif held is not None:
        figures.append("No preference change could be measured: that needs at least 3 held-out turns you "
                       "liked and 3 you corrected.")
    accuracy = n.get("accuracy")
    if accuracy:
        figures.append(
            f"Given a reply you liked and one you corrected, it rates the liked one likelier in "
            f"{_pct(accuracy.get('candidate'))} of pairs ({against}: {_pct(accuracy.get('parent'))}).")
    kl = n.get("kl")
    if kl and kl.get("away") is not None:
        figures.append(
            f"Against your hints: it moved {kl['away']:.3f} nats per token away from what the base model "
            f"prefers once given the hint (at most {kl.get('tolerance', 0.02)} is allowed).")
    canary = n.get("canary") or {}
    empty, repetition = canary.get("empty") or {}, canary.get("repetition") or {}
    if empty.get("candidate") is not None:
        base = ("" if base_is_parent or empty.get("base") is None
                else f", the base model {_pct(empty['base'])}")
        figures.append(
            f"On fixed prompts no one can train it on: {_pct(empty['candidate'])} empty replies ({against} "
            f"{_pct(empty.get('parent'))}{base}) and {_pct(repetition.get('candidate'))} repeated word "
            f"triples ({against} {_pct(repetition.get('parent'))}).")
    capability = n.get("capability")
    if capability:
        figures.append(
            f"It answers {capability['candidate']} of {capability['asked']} fixed factual questions right; "
            f"the base model {capability['base']}.")
    return figures


def _tried(tenant: Tenant, version: AdapterVersion, limit: int = 3) -> list[tuple[str, str, str]]:
    """The user's newest playground comparisons of this version with the base model: the same prompt, both
    replies, as stored."""
    from clawhub.conversations.identity import newest_user_text
    from clawhub.conversations.models import Turn
    from clawhub.conversations.selectors import turns_messages
    from clawhub.review.services import reply_text
    from clawhub.tenants.naming import BASE_MODEL_ID

    mine = list(Turn.objects.filter(tenant=tenant, turn_type=Turn.Type.PLAYGROUND, adapter_version=version,
                                    status=Turn.Status.COMPLETE).order_by("-created_at")[:limit])
    bases = {t.session_id: t for t in Turn.objects.filter(
        session_id__in=[t.session_id for t in mine], turn_type=Turn.Type.PLAYGROUND, model=BASE_MODEL_ID,
        status=Turn.Status.COMPLETE)}
    messages = turns_messages(turns=mine)
    return [(newest_user_text(messages.get(t.pk) or []), reply_text(bases[t.session_id]), reply_text(t))
            for t in mine if t.session_id in bases]


def _comparison(tenant: Tenant, versions: list[AdapterVersion]) -> Comparison | None:
    judged = [v for v in versions if isinstance((v.metrics or {}).get("eval"), dict)]
    active = next((v for v in judged if v.state == AdapterVersion.State.ACTIVE), None)
    version = active or (judged[-1] if judged else None)
    if version is None:
        return None
    numbers = version.metrics["eval"].get("numbers") or {}
    against = f"v{version.parent.version}" if version.parent_id else "the base model"
    shown = numbers.get("canaries") or {}
    canaries = list(zip(shown.get("parent") or [], shown.get("candidate") or [], strict=False))
    return Comparison(version=version, against=against,
                      figures=_figures(numbers, against, base_is_parent=not version.parent_id),
                      canaries=canaries, tried=_tried(tenant, version))


def learning_for_tenant(*, tenant: Tenant, days: int = DAYS) -> Learning:
    from clawhub.web.progress import stalled_for

    versions = list(AdapterVersion.objects.filter(tenant=tenant).select_related("parent").order_by("version"))
    gate = [GateRow(v, *_margin(v)) for v in versions if v.decision or _margin(v)[0] is not None]
    since = timezone.now() - timedelta(days=days)
    per_day = _days(tenant, since=since)
    chart = None
    if per_day:
        chart = bar_chart(
            title="Judged turns per day",
            categories=[d.isoformat() for d, *_ in per_day],
            series={"positive": [p for _, p, _, _ in per_day], "unsure": [n for _, _, n, _ in per_day],
                    "negative": [g for *_, g in per_day]},
            x_label="day", y_label="turns", colors=("#009e73", "#e69f00", "#d55e00"),
            tick_label=lambda c: c[5:],
        )
    verdict, kind = _verdict(gate, per_day)
    return Learning(tenant=tenant, verdict=verdict, verdict_kind=kind, gate=gate,
                    gate_chart=interval_chart(gate), days=per_day, days_chart=chart,
                    timeline=_timeline(tenant, versions),
                    explicit=ExplicitFeedback.objects.filter(tenant=tenant).count(),
                    comparison=_comparison(tenant, versions), stalled=stalled_for(tenant=tenant))
