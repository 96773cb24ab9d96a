"""The persona benchmark across seeds: per method and tenant track, held-out compliance at each promoted
update as mean, standard deviation and range over the seeds, updates to the target per seed, the worst
feedback→served time, the gate's decisions, and the adversary's shift of the group — what the command prints
and plots as one band per method. Plain Python on the per-(method, seed) result dicts of Bench.run."""

from __future__ import annotations

import statistics
from collections import Counter
from typing import Any

GAIN = 0.30  # the gain over the base (update 0) a method must reach on every seed


def first_gain(curve: list[float | None], gain: float = GAIN) -> int | None:
    """The first update whose compliance is at least ``gain`` above the base's (update 0); None if none is."""
    if not curve or curve[0] is None:
        return None
    return next((i for i, c in enumerate(curve) if i and c is not None and c >= curve[0] + gain - 1e-9), None)


def tracks_of(result: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """A method result's track summaries by track name (the group's two tracks flattened)."""
    tracks = {k: v for k, v in result.items() if isinstance(v, dict) and "compliance" in v}
    group = result.get("group") or {}
    if "with_adversary" in group:
        tracks["group"] = group["with_adversary"]
    if "without_adversary" in group:
        tracks["group-control"] = group["without_adversary"]
    return tracks


def band(curves: list[list[float | None]]) -> dict[str, list[float | None]]:
    """Mean, sd, min and max at each update over the seeds that reached it (None where none did)."""
    length = max((len(c) for c in curves), default=0)
    out: dict[str, list[float | None]] = {"mean": [], "sd": [], "low": [], "high": [], "seeds": []}
    for i in range(length):
        values = [c[i] for c in curves if i < len(c) and c[i] is not None]
        out["seeds"].append(len(values))
        if not values:
            for key in ("mean", "sd", "low", "high"):
                out[key].append(None)
            continue
        out["mean"].append(round(statistics.fmean(values), 4))
        out["sd"].append(round(statistics.stdev(values), 4) if len(values) > 1 else 0.0)
        out["low"].append(round(min(values), 4))
        out["high"].append(round(max(values), 4))
    return out


def across_seeds(results: list[dict[str, Any]], *, target: float = 0.8) -> dict[str, Any]:
    by_method: dict[str, list[dict[str, Any]]] = {}
    for result in results:
        by_method.setdefault(result["method"], []).append(result)
    summary: dict[str, Any] = {}
    for method, runs in by_method.items():
        names = sorted({name for run in runs for name in tracks_of(run)})
        # Sorted and once each: a report over several folders may hold a seed once per persona.
        entry: dict[str, Any] = {"seeds": sorted({run["seed"] for run in runs}),
                                 "in_process": any(run.get("track") == "in-process" for run in runs)}
        for name in names:
            per_seed = [tracks_of(run)[name] for run in runs if name in tracks_of(run)]
            curves = [t["compliance"] for t in per_seed]
            served = [s for t in per_seed for s in t.get("feedback_to_served_s") or []]
            decisions = Counter(
                g.get("decision") or g.get("outcome") for t in per_seed for g in t.get("gate") or []
            )
            finals = [c[-1] for c in curves if c and c[-1] is not None]
            stages: dict[str, list[float]] = {}
            for t in per_seed:
                for update in t.get("feedback_to_served_stages_s") or []:
                    for stage, seconds in update.items():
                        stages.setdefault(stage, []).append(seconds)
            walls = [w for t in per_seed for w in t.get("update_wall_s") or [] if w is not None]
            entry[name] = {
                "compliance": band(curves),
                "capability": band([t["capability"] for t in per_seed if t.get("capability")]),
                "prompt_only": [t.get("prompt_only") for t in per_seed],
                "judge_agreement": [t.get("judge_agreement") for t in per_seed],
                "update_wall_s": {"median": round(statistics.median(walls), 1), "max": max(walls)}
                if walls else None,
                "final": {
                    "mean": round(statistics.fmean(finals), 4) if finals else None,
                    "low": min(finals, default=None),
                    "high": max(finals, default=None),
                },
                "updates_to_target": [t.get("updates_to_target") for t in per_seed],
                "updates_to_gain": [first_gain(c) for c in curves],
                "reached_target_on_every_seed": all(t.get("updates_to_target") is not None for t in per_seed),
                "feedback_to_served_max_s": max(served, default=None),
                "feedback_to_served_over_60_s": sum(s > 60 for s in served),
                # Per stage of feedback→served (Bench's feedback_stages): median and worst over the updates.
                "stages_s": {stage: {"median": round(statistics.median(v), 1), "max": max(v)}
                             for stage, v in stages.items()},
                "gate_decisions": dict(decisions),
            }
        shifts = [run["group"]["adversary_shift"]["final"] for run in runs
                  if (run.get("group") or {}).get("adversary_shift")]
        if shifts:
            entry["adversary_shift_final"] = {"per_seed": shifts, "mean": round(statistics.fmean(
                [s for s in shifts if s is not None]), 4) if any(s is not None for s in shifts) else None}
        summary[method] = entry
    return summary


def report_lines(summary: dict[str, Any], *, target: float = 0.8) -> list[str]:
    """The human-readable table: per method and track, compliance per update as mean ± sd [min, max]."""
    lines = []
    for method, entry in summary.items():
        lines.append(f"== {method} (seeds {', '.join(map(str, entry['seeds']))})")
        for name, track in entry.items():
            if not isinstance(track, dict) or "compliance" not in track:
                continue
            b = track["compliance"]
            cells = [
                "—" if m is None else f"{m:.2f}±{s:.2f} [{lo:.2f},{hi:.2f}]"
                for m, s, lo, hi in zip(b["mean"], b["sd"], b["low"], b["high"], strict=True)
            ]
            lines.append(f"  {name}: " + " | ".join(f"u{i} {c}" for i, c in enumerate(cells)))
            if entry.get("in_process"):  # no gate: its "served" time is training
                delivery = (f"training max {track['feedback_to_served_max_s']} s; promoted directly "
                            "(the in-process track has no gate)")
            else:
                delivery = (f"feedback→served max {track['feedback_to_served_max_s']} s; "
                            f"gate: {track['gate_decisions']}")
            lines.append(f"    updates to {target}: {track['updates_to_target']}; to the base + {GAIN:.2f}: "
                         f"{track['updates_to_gain']}; {delivery}")
            capability = track.get("capability") or {}
            if capability.get("mean"):
                lines.append("    capability guard: " + " | ".join(
                    "—" if m is None else f"u{i} {m:.2f}" for i, m in enumerate(capability["mean"])))
            if any(p is not None for p in track.get("prompt_only") or []):
                lines.append(f"    prompt-only baseline (base + the preference as system prompt), per seed: "
                             f"{track['prompt_only']}")
            for a in filter(None, track.get("judge_agreement") or []):
                lines.append(f"    judge vs the users: agreement {a['agreement']} over {a['judged']} judged "
                             f"of {a['reactions']} reactions (coverage {a['coverage']})")
            if track.get("update_wall_s"):
                lines.append(f"    wall time per update (s): {track['update_wall_s']}")
            if track.get("stages_s"):
                what = "update" if entry.get("in_process") else "feedback→served"
                lines.append(f"    {what} by stage (median/max s): " + ", ".join(
                    f"{stage} {v['median']}/{v['max']}" for stage, v in track["stages_s"].items()))
        if "adversary_shift_final" in entry:
            shift = entry["adversary_shift_final"]
            lines.append(f"  adversary shift (control − attacked, last update): {shift}")
    return lines
