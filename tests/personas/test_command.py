"""bench_personas runs every method with the same seeds, then reports across seeds: mean ± spread per
update, the gate's decisions, and one band per method in the plot."""

import json

import pytest
from django.core.management import CommandError, call_command

import clawhub.devtools.management.commands.bench_personas as command


class FakeBench:
    """Stands in for the HTTP-driven Bench: one result per method whose curve depends on the seed."""

    runs: list[tuple[int, tuple[str, ...], float]] = []

    def __init__(self, config, *, echo, log):
        self.config, self.echo, self.results, self.tracks = config, echo, [], {}
        FakeBench.runs.append((config.seed, config.methods, config.noise))

    def run(self):
        for method in self.config.methods:
            curve = [0.2, 0.5 + 0.1 * self.config.seed]
            track = {"compliance": curve, "updates_to_target": None, "feedback_to_served_s": [30.0],
                     "gate": [{"version": 1, "outcome": "active", "decision": "not_enough_evidence"}]}
            self.results.append({"method": method, "seed": self.config.seed, "student": track})
            self.echo(json.dumps(self.results[-1]))
        return self.results

    def write_outputs(self):
        pass

    def close(self):
        pass


def test_every_method_runs_with_the_same_seeds_and_is_reported_across_them(monkeypatch, tmp_path, settings):
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setattr(command, "Bench", FakeBench)
    FakeBench.runs = []
    out, err = _Capture(), _Capture()
    call_command("bench_personas", "--methods", "rl,opd", "--seeds", "0,1,2", "--noise", "0.15",
                 "--out", str(tmp_path / "out"), stdout=out, stderr=err)
    assert FakeBench.runs == [(s, ("rl", "opd"), 0.15) for s in (0, 1, 2)]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rl"]["seeds"] == summary["opd"]["seeds"] == [0, 1, 2]
    assert summary["rl"]["student"]["compliance"]["mean"] == [0.2, 0.6]
    assert summary["rl"]["student"]["compliance"]["low"] == [0.2, 0.5]
    assert summary["opd"]["student"]["gate_decisions"] == {"not_enough_evidence": 3}
    assert "u1 0.60±0.10 [0.50,0.70]" in err.text
    assert (tmp_path / "out" / "compliance-bands.png").read_bytes().startswith(b"\x89PNG")
    assert '"across_seeds"' in out.text



def test_in_process_runs_each_seed_reports_across_them_and_leaves_the_dashboard_alone(monkeypatch, tmp_path,
                                                                                     settings):
    settings.DATA_DIR = tmp_path / "data"
    monkeypatch.setattr(command, "InProcessBench", FakeBench)
    FakeBench.runs = []
    out, err = _Capture(), _Capture()
    call_command("bench_personas", "--in-process", "--methods", "combine", "--seeds", "0,1", "--noise", "0.1",
                 "--model", str(tmp_path / "model"), "--out", str(tmp_path / "out"), stdout=out, stderr=err)
    assert FakeBench.runs == [(0, ("combine",), 0.1), (1, ("combine",), 0.1)]
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["combine"]["student"]["compliance"]["mean"] == [0.2, 0.55]
    assert (tmp_path / "out" / "compliance-bands.png").read_bytes().startswith(b"\x89PNG")
    assert not (tmp_path / "data" / "bench" / "personas.png").exists()  # a stack's result only
    assert "(and " not in err.text


def test_report_puts_runs_from_separate_folders_in_one_table(tmp_path):
    def save(folder, method, seed, name, curve):
        (tmp_path / folder / f"seed-{seed}").mkdir(parents=True, exist_ok=True)
        track = {"compliance": curve, "updates_to_target": None, "feedback_to_served_s": [40.0], "gate": []}
        line = json.dumps({"method": method, "seed": seed, name: track})
        with open(tmp_path / folder / f"seed-{seed}" / "results.jsonl", "a") as f:
            f.write(line + "\n")

    save("rl", "rl", 0, "brief", [0.0, 0.1, 0.2])
    save("rl", "rl", 1, "brief", [0.0, 0.0, 0.1])
    save("combine", "combine", 0, "brief", [0.0, 0.4, 0.6])
    save("asks", "combine", 0, "asks-back", [0.1, 0.2, 0.3])  # the same method and seed, another persona
    out, err = _Capture(), _Capture()
    folders = ",".join(str(tmp_path / f) for f in ("rl", "combine", "asks"))
    call_command("bench_personas", "--report", folders, "--out", str(tmp_path / "out"), stdout=out,
                 stderr=err)
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["rl"]["seeds"] == [0, 1]
    assert summary["rl"]["brief"]["compliance"]["mean"] == [0.0, 0.05, 0.15]
    assert summary["combine"]["seeds"] == [0]
    assert summary["combine"]["brief"]["updates_to_gain"] == [1]
    assert summary["combine"]["asks-back"]["updates_to_gain"] == [None]  # +0.20 over its base only
    assert summary["rl"]["brief"]["updates_to_gain"] == [None, None]
    assert (tmp_path / "out" / "compliance-bands.png").read_bytes().startswith(b"\x89PNG")
    with pytest.raises(CommandError, match="no seed-"):
        call_command("bench_personas", "--report", str(tmp_path / "nowhere"), "--out", str(tmp_path / "o2"))


def test_the_prompt_only_band_is_drawn_once_per_persona_whatever_the_methods():
    def track(curve, prompt_only):
        return {"compliance": {"mean": curve, "low": curve, "high": curve}, "prompt_only": prompt_only}

    summary = {"rl": {"seeds": [0, 1], "brief": track([0.0, 0.1], [0.1, 0.2])},
               "opd": {"seeds": [0, 1], "brief": track([0.0, 0.3], [0.1, 0.2]),
                       "plain": track([0.0, 0.2], [None, 0.0])}}
    bands = command.compliance_bands(summary)
    assert list(bands) == ["rl brief", "opd brief", "opd plain", "brief prompt-only", "plain prompt-only"]
    baseline = bands["brief prompt-only"]
    assert baseline == {"mean": [pytest.approx(0.15)] * 2, "low": [0.1] * 2, "high": [0.2] * 2}


@pytest.mark.parametrize("in_process", [False, True])
def test_no_seed_and_bad_overrides_are_refused_before_anything_runs(monkeypatch, in_process):
    monkeypatch.setattr(command, "InProcessBench", FakeBench)
    monkeypatch.setattr(command, "Bench", FakeBench)
    FakeBench.runs = []
    where = ["--in-process"] if in_process else []
    with pytest.raises(CommandError, match="--seeds names no seed"):
        call_command("bench_personas", *where, "--seeds", " ", stdout=_Capture(), stderr=_Capture())
    with pytest.raises(CommandError, match="Expecting property name"):
        call_command("bench_personas", *where, "--overrides", "{lr", stdout=_Capture(), stderr=_Capture())
    assert FakeBench.runs == []

class _Capture:
    def __init__(self):
        self.text = ""

    def write(self, s):
        self.text += s

    def flush(self):
        pass
