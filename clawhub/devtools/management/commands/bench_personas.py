"""`python manage.py bench_personas`: the persona benchmark against a running ClawHub
(clawhub.devtools.personas.driver), on the model the stack serves (SmolLM2-135M-Instruct by default).

    CLAWHUB_TRAIN_BUDGET_RUNS_PER_HOUR=0 ./dev run &   # or any running stack
    python manage.py bench_personas --methods rl,opd,combine --seeds 0,1,2 --max-updates 12

Every method runs with the same seeds (same simulated users, same prompts, same noise); the result is
printed per (method, seed) as it finishes, then across seeds: held-out compliance per update as mean ± sd
[min, max], the capability guard per update, the base and prompt-only baselines, updates to the target per
seed, the worst feedback→served time, the gate's decisions (each one is also printed with its reason as it
happens) and how the judge read the users' reactions. The held-out prompts are on topics no training session
asks about (clawhub.devtools.personas.personas.HELD_OUT_TOPICS), sampled --eval-samples times each at the
served temperature; --noise is the share of the users' reactions that are the opposite of what they perceived.

Every tenant trains up to twice --max-updates runs within minutes, so the stack's per-tenant budget of runs
per hour (CLAWHUB_TRAIN_BUDGET_RUNS_PER_HOUR, 6 by default) must be lifted (0 = no limit), or the tracks stop
at their seventh run with the budget's 429. The embedded stack's one worker runs judging, training and the
gate one task at a time; with several benchmarks at once, start a second worker for the judge and
housekeeping queues (as a deployment has), or judged feedback may wait longer than --judge-wait.

``--in-process`` runs the same users, judge rules, trainer and measurements in this process instead, on the
model folder ``--model`` (the prepared SmolLM2 by default): replies sampled with Hugging Face generate
instead of vLLM, every update promoted without capture, review or gate
(clawhub.devtools.personas.in_process says exactly what differs). No stack is needed; an update of
SmolLM2-135M-Instruct takes minutes on a CPU instead of the stack's ~50.

    python manage.py bench_personas --in-process --methods combine --seeds 0 --max-updates 12

``--in-process --rescore FOLDER,...`` scores versions a run exported (and the base and the prompt-only
baseline) on one persona at ``--eval-max-tokens`` instead of running.

``--report FOLDER,...`` reports earlier runs together instead of running: every ``seed-*/results.jsonl``
under the named ``--out`` folders (methods or personas run side by side in separate processes) in one table,
summary.json and band plots, written to ``--out``.

It talks to the stack over HTTP only; the one local write besides --out is a copy of the band plot into the
data directory (CLAWHUB_DATA_DIR/bench/personas.png), where the dashboard picks it up, so run it with the
same CLAWHUB_DATA_DIR as the stack.
"""

import json
import logging
import shutil
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from clawhub.devtools.personas import personas
from clawhub.devtools.personas.client import BenchError
from clawhub.devtools.personas.config import DEFAULT_OVERRIDES, BenchConfig
from clawhub.devtools.personas.driver import Bench
from clawhub.devtools.personas.in_process import InProcessBench, InProcessConfig
from clawhub.devtools.personas.plots import band_chart_png
from clawhub.devtools.personas.summary import across_seeds, report_lines
from clawhub.devtools.personas.tracks import METHODS
from clawhub.web.progress import bench_plot_path
from workers import base_models


def compliance_bands(summary: dict) -> dict[str, dict]:
    """The band plot's bands: one per method and track, and the prompt-only baseline as a flat band over the
    updates (its spread over the seeds) once per track, as it does not depend on the method."""
    bands: dict[str, dict] = {}
    baselines: dict[str, dict] = {}
    for method, entry in summary.items():
        for name, track in entry.items():
            if not isinstance(track, dict) or "compliance" not in track:
                continue
            bands[f"{method} {name}"] = track["compliance"]
            values = [v for v in track.get("prompt_only") or [] if v is not None]
            if values and f"{name} prompt-only" not in baselines:
                n = len(track["compliance"]["mean"])
                baselines[f"{name} prompt-only"] = {"mean": [sum(values) / len(values)] * n,
                                                    "low": [min(values)] * n, "high": [max(values)] * n}
    return {**bands, **baselines}


class Command(BaseCommand):
    help = ("Persona benchmark: simulated users chat through /v1, their feedback trains their adapters, "
            "compliance is scored by code.")

    def add_arguments(self, parser):
        parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: rl,opd,combine")
        parser.add_argument("--seeds", default="0,1,2",
                            help="comma-separated seeds, the same for every method")
        parser.add_argument("--noise", type=float, default=personas.NOISE_RATE,
                            help="share of simulated reactions opposite to what the user perceived")
        parser.add_argument("--max-updates", type=int, default=12, help="promoted updates per tenant")
        parser.add_argument("--judge", choices=["rule", "llm"], default="rule")
        parser.add_argument("--base-url", default=settings.PUBLIC_BASE_URL)
        parser.add_argument("--out", default="bench-output/")
        parser.add_argument("--personas", default=personas.PRIMARY.name,
                            help=f"comma-separated: {','.join(personas.PERSONAS)}")
        parser.add_argument("--phrasings", choices=["training", "held-out"], default="training",
                            help="which half of each reaction pool the simulated users speak from")
        parser.add_argument("--group", action="store_true",
                            help="also a group of three sharing one adapter, one of them adversarial")
        parser.add_argument("--no-group-control", action="store_true",
                            help="skip the all-honest control group (the adversary's shift goes unmeasured)")
        parser.add_argument("--batch-size", type=int, default=16)
        parser.add_argument("--turns-per-session", type=int, default=2)
        parser.add_argument("--overrides", default=json.dumps(DEFAULT_OVERRIDES),
                            help="TrainConfig overrides, JSON (default: %(default)s)")
        parser.add_argument("--chat-temperature", type=float, default=0.7,
                            help="the simulated users' sampling temperature (exploration)")
        parser.add_argument("--eval-temperature", type=float, default=None,
                            help="held-out sampling temperature (default: the served one)")
        parser.add_argument("--eval-samples", type=int, default=personas.EVAL_SAMPLES,
                            help="samples per held-out prompt")
        parser.add_argument("--no-capability", action="store_true", help="skip the capability guard")
        parser.add_argument("--no-prompt-only", action="store_true", help="skip the prompt-only baseline")
        parser.add_argument("--target", type=float, default=0.8)
        parser.add_argument("--stop-at-target", action="store_true")
        parser.add_argument("--update-timeout", type=float, default=1800.0)
        parser.add_argument("--judge-wait", type=float, default=180.0,
                            help="seconds to wait for sent feedback to be judged before a track stops")
        parser.add_argument("--in-process", action="store_true",
                            help="no stack: sample, judge, train and measure in this process (see above)")
        parser.add_argument("--model", default=None,
                            help="--in-process: the model folder (default: the prepared default model)")
        parser.add_argument("--threads", type=int, default=1, help="--in-process: torch threads")
        parser.add_argument("--parallel-sessions", type=int, default=8,
                            help="--in-process: sessions sampled together in one batched generate")
        parser.add_argument("--eval-max-tokens", type=int, default=64,
                            help="--in-process: held-out replies are cut here (a cut reply never complies)")
        parser.add_argument("--rescore", default="",
                            help="--in-process: comma-separated version folders a run exported; scores them, "
                                 "the base and the prompt-only baseline on the one --personas at "
                                 "--eval-max-tokens (first of --seeds) instead of running")
        parser.add_argument("--report", default="",
                            help="comma-separated --out folders of earlier runs: their results reported "
                                 "together (table, summary.json, band plots in --out) instead of running")
        parser.add_argument("--capability-gate", action="store_true",
                            help="--in-process: reject an update that loses more of the capability guard "
                                 "than the promotion gate allows; the next continues the last promoted one")
        parser.add_argument("--shuffle-rewards", action="store_true",
                            help="--in-process: the null control: each batch's rewards permuted among its "
                                 "samples and its hints dropped (an update that teaches no preference)")

    def handle(self, *args, **options):
        if options["report"]:
            return self._report_saved(options)
        if options["rescore"]:
            return self._rescore(options)
        if options["in_process"]:
            return self._run(InProcessBench, self._configs(options, self._in_process_config), options,
                             dashboard=False)
        configs = self._configs(options, self._stack_config)
        # One line per request would bury the progress lines.
        for name in ("httpx", "httpx2"):  # the openai SDK logs through the latter
            logging.getLogger(name).setLevel(logging.WARNING)
        self._run(Bench, configs, options)

    @staticmethod
    def _configs(options, config_for) -> list:
        """``config_for(options, seed)`` for each of --seeds; a CommandError for a bad value or no seed."""
        try:
            seeds = [int(s) for s in options["seeds"].split(",") if s.strip()]
            configs = [config_for(options, seed) for seed in seeds]
        except (ValueError, json.JSONDecodeError) as exc:
            raise CommandError(str(exc)) from exc
        if not configs:
            raise CommandError("--seeds names no seed")
        return configs

    @staticmethod
    def _stack_config(options, seed: int) -> BenchConfig:
        return BenchConfig(
            base_url=options["base_url"],
            methods=tuple(m for m in options["methods"].split(",") if m),
            seed=seed, noise=options["noise"], max_updates=options["max_updates"],
            judge=options["judge"], out_dir=Path(options["out"]) / f"seed-{seed}",
            personas=tuple(p for p in options["personas"].split(",") if p),
            group=options["group"], group_control=not options["no_group_control"],
            phrasings=options["phrasings"], chat_temperature=options["chat_temperature"],
            eval_samples=options["eval_samples"], capability=not options["no_capability"],
            prompt_only=not options["no_prompt_only"],
            batch_size=options["batch_size"], turns_per_session=options["turns_per_session"],
            overrides=json.loads(options["overrides"]), eval_temperature=options["eval_temperature"],
            target=options["target"], stop_at_target=options["stop_at_target"],
            update_timeout=options["update_timeout"], judge_wait=options["judge_wait"],
        )

    @staticmethod
    def _in_process_config(options, seed: int) -> InProcessConfig:
        return InProcessConfig(
            model=Path(options["model"] or base_models.default_model_dir()),
            methods=tuple(m for m in options["methods"].split(",") if m), seed=seed,
            noise=options["noise"], max_updates=options["max_updates"],
            personas=tuple(p for p in options["personas"].split(",") if p),
            phrasings=options["phrasings"], batch_size=options["batch_size"],
            turns_per_session=options["turns_per_session"],
            overrides=json.loads(options["overrides"]), chat_temperature=options["chat_temperature"],
            eval_temperature=options["eval_temperature"],
            eval_samples=options["eval_samples"], parallel_sessions=options["parallel_sessions"],
            capability=not options["no_capability"], prompt_only=not options["no_prompt_only"],
            target=options["target"], threads=options["threads"],
            shuffle_rewards=options["shuffle_rewards"], eval_max_tokens=options["eval_max_tokens"],
            capability_gate=options["capability_gate"], out_dir=Path(options["out"]) / f"seed-{seed}",
        )

    def _rescore(self, options) -> None:
        if not options["in_process"]:
            raise CommandError("--rescore needs --in-process")
        [config, *_] = self._configs(options, self._in_process_config)
        if len(config.personas) != 1:
            raise CommandError("--rescore scores one persona: name it with --personas")
        adapters = [Path(a) for a in options["rescore"].split(",") if a.strip()]
        missing = [str(a) for a in adapters if not (a / "adapter_config.json").is_file()]
        if missing:
            raise CommandError(f"not an exported version (no adapter_config.json): {', '.join(missing)}")
        bench = InProcessBench(config, echo=lambda line: self.stdout.write(line),
                               log=lambda line: self.stderr.write(line))
        for row in bench.rescore(personas.PERSONAS[config.personas[0]], adapters):
            self.stdout.write(json.dumps(row))

    def _report_saved(self, options) -> None:
        folders = [Path(f) for f in options["report"].split(",") if f.strip()]
        files = sorted(path for folder in folders for path in folder.glob("seed-*/results.jsonl"))
        if not files:
            raise CommandError(f"no seed-*/results.jsonl under {', '.join(map(str, folders)) or '(none)'}")
        lines = [line for path in files for line in path.read_text().splitlines() if line.strip()]
        results = [json.loads(line) for line in lines]
        self._report(results, out=Path(options["out"]), target=options["target"], dashboard=False)

    def _run(self, bench_class, configs: list, options, *, dashboard: bool = True) -> None:
        """One bench per config in turn; what finished is written and reported, also when a run fails."""
        results: list[dict] = []
        try:
            for config in configs:
                bench = bench_class(config, echo=lambda line: self.stdout.write(line),
                                    log=lambda line: self.stderr.write(line))
                try:
                    bench.run()
                except BenchError as exc:
                    raise CommandError(str(exc)) from exc
                finally:
                    results += bench.results  # what finished, also when a later method failed
                    if bench.tracks:
                        bench.write_outputs()
                    bench.close()
        finally:
            if results:
                self._report(results, out=Path(options["out"]), target=options["target"], dashboard=dashboard)

    def _report(self, results: list[dict], *, out: Path, target: float, dashboard: bool = True) -> None:
        summary = across_seeds(results, target=target)
        out.mkdir(parents=True, exist_ok=True)
        (out / "summary.json").write_text(json.dumps(summary, indent=2))
        self.stdout.write(json.dumps({"across_seeds": summary}))
        for line in report_lines(summary, target=target):
            self.stderr.write(line)
        tracks = [(f"{method} {name}", track) for method, entry in summary.items()
                  for name, track in entry.items() if isinstance(track, dict) and "compliance" in track]
        bands = compliance_bands(summary)
        # "0, 1, 2", not a list: the plot's font has no brackets.
        seeds = ", ".join(str(s) for s in sorted({r["seed"] for r in results}))
        png = out / "compliance-bands.png"
        png.write_bytes(band_chart_png(bands, title=f"held-out compliance, seeds {seeds}", target=target))
        guard = {label: track["capability"] for label, track in tracks if track["capability"]["mean"]}
        if guard:
            (out / "capability-bands.png").write_bytes(
                band_chart_png(guard, title=f"capability guard, seeds {seeds}", target=None))
        if not dashboard:
            self.stderr.write(f"plot: {png}")
            return
        plot = bench_plot_path()
        plot.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(png, plot)
        self.stderr.write(f"plot: {png} (and {plot} for the dashboard)")
