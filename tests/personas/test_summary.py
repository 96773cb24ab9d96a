"""Across seeds: mean, spread and range per update, updates to the target per seed, the gate's decisions,
the adversary's shift, and one band per method in the plot."""

import pytest

from clawhub.devtools.personas.plots import band_chart_png
from clawhub.devtools.personas.summary import across_seeds, band, first_gain, report_lines


def result(method, seed, student, group, control, served=(12.0,), gate=("promote",)):
    def track(curve):
        reached = next((i for i, c in enumerate(curve) if c is not None and c >= 0.8), None)
        return {"compliance": curve, "updates_to_target": reached, "feedback_to_served_s": list(served),
                "gate": [{"version": i + 1, "outcome": "active", "decision": d} for i, d in enumerate(gate)]}

    return {"method": method, "seed": seed, "student": track(student),
            "group": {"with_adversary": track(group), "without_adversary": track(control),
                      "adversary_shift": {"final": round(control[-1] - group[-1], 4)}}}


def test_band_is_mean_sd_and_range_over_the_seeds_that_reached_each_update():
    b = band([[0.2, 0.5, 0.9], [0.4, 0.7], [0.3, 0.6, 0.7]])
    assert b["mean"] == [0.3, 0.6, 0.8] and b["seeds"] == [3, 3, 2]
    assert b["low"] == [0.2, 0.5, 0.7] and b["high"] == [0.4, 0.7, 0.9]
    assert b["sd"][0] == pytest.approx(0.1) and b["sd"][2] == pytest.approx(0.1414, abs=1e-4)


def test_first_gain_is_the_first_update_at_least_the_gain_above_the_base():
    assert first_gain([0.0, 0.1, 0.3, 0.2]) == 2
    assert first_gain([0.16, 0.4, 0.46]) == 2  # over the base, not over zero
    assert first_gain([0.5, 0.7, 0.79]) is None
    assert first_gain([None, 0.9]) is None and first_gain([]) is None


def test_across_seeds_reports_every_track_and_method_the_same_way():
    results = [
        result("rl", 0, [0.2, 0.5, 0.85], [0.2, 0.4], [0.2, 0.6], served=(10.0, 70.0)),
        result("rl", 1, [0.2, 0.6, 0.7], [0.2, 0.3], [0.2, 0.5], gate=("not_enough_evidence", "reject")),
        result("combine", 0, [0.2, 0.9], [0.2, 0.8], [0.2, 0.9]),
    ]
    summary = across_seeds(results)
    rl = summary["rl"]
    assert rl["seeds"] == [0, 1]
    assert rl["student"]["compliance"]["mean"] == [0.2, 0.55, 0.775]
    assert rl["student"]["updates_to_target"] == [2, None]
    assert not rl["student"]["reached_target_on_every_seed"]
    assert rl["student"]["feedback_to_served_max_s"] == 70.0
    assert rl["student"]["gate_decisions"] == {"promote": 1, "not_enough_evidence": 1, "reject": 1}
    assert set(rl) >= {"group", "group-control"} and rl["group"]["compliance"]["mean"] == [0.2, 0.35]
    assert rl["adversary_shift_final"] == {"per_seed": [0.2, 0.2], "mean": 0.2}
    assert summary["combine"]["student"]["reached_target_on_every_seed"]
    lines = "\n".join(report_lines(summary))
    assert "== rl (seeds 0, 1)" in lines and "u1 0.55±0.07 [0.50,0.60]" in lines
    assert "adversary shift" in lines


def test_the_band_plot_draws_one_filled_band_per_method():
    bands = {"rl student": band([[0.1, 0.3], [0.3, 0.5]]), "combine student": band([[0.5, 0.9], [0.5, 0.9]])}
    png = band_chart_png(bands)
    assert png.startswith(b"\x89PNG")
    # A band with spread fills pixels a zero-spread band does not: the images differ only by the fill.
    flat = band_chart_png({"rl student": band([[0.2, 0.4], [0.2, 0.4]]),
                           "combine student": band([[0.5, 0.9], [0.5, 0.9]])})
    assert flat != png


def test_an_in_process_run_reports_training_time_and_direct_promotion_not_feedback_to_served():
    run = result("combine", 0, [0.0, 0.5], [0.0], [0.0], served=(22.0,), gate=("promoted",))
    lines = "\n".join(report_lines(across_seeds([{**run, "track": "in-process"}])))
    assert "training max 22.0 s; promoted directly" in lines
    assert "feedback→served" not in lines and "gate:" not in lines
    stack = "\n".join(report_lines(across_seeds([run])))
    assert "feedback→served max 22.0 s; gate: {'promoted': 1}" in stack
