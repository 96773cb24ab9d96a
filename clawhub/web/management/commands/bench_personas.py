"""`python manage.py bench_personas`: the persona benchmark against a running ClawHub (clawhub.bench.driver).

    python manage.py serve &                                   # or any running stack
    python manage.py bench_personas --methods rl,opd,combine --seed 0 --max-updates 16

It talks to the stack over HTTP only; the one local write besides --out is a copy of the plot into the data
directory (CLAWHUB_DATA_DIR/bench/personas.png), where the dashboard picks it up, so run it with the same
CLAWHUB_DATA_DIR as the stack.
"""

import json
import logging
import shutil
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from clawhub.bench.driver import DEFAULT_OVERRIDES, METHODS, Bench, BenchConfig, BenchError
from clawhub.bench.progress import bench_plot_path


class Command(BaseCommand):
    help = ("Persona benchmark: simulated users chat through /v1, their feedback trains their adapters, "
            "compliance is scored by code.")

    def add_arguments(self, parser):
        parser.add_argument("--methods", default=",".join(METHODS), help="comma-separated: rl,opd,combine")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--max-updates", type=int, default=16, help="promoted updates per tenant")
        parser.add_argument("--judge", choices=["rule", "llm"], default="rule")
        parser.add_argument("--base-url", default=settings.PUBLIC_BASE_URL)
        parser.add_argument("--out", default="bench-output/")
        parser.add_argument("--personas", default="student,teacher")
        parser.add_argument("--no-group", action="store_true", help="skip the group tenants")
        parser.add_argument("--no-group-control", action="store_true",
                            help="skip the all-honest control group (the adversary's shift goes unmeasured)")
        parser.add_argument("--batch-size", type=int, default=16)
        parser.add_argument("--turns-per-session", type=int, default=3)
        parser.add_argument("--overrides", default=json.dumps(DEFAULT_OVERRIDES),
                            help="TrainConfig overrides, JSON (default: %(default)s)")
        parser.add_argument("--eval-temperature", type=float, default=0.0)
        parser.add_argument("--target", type=float, default=0.8)
        parser.add_argument("--stop-at-target", action="store_true")
        parser.add_argument("--update-timeout", type=float, default=1800.0)

    def handle(self, *args, **options):
        try:
            config = BenchConfig(
                base_url=options["base_url"], methods=tuple(m for m in options["methods"].split(",") if m),
                seed=options["seed"], max_updates=options["max_updates"], judge=options["judge"],
                out_dir=Path(options["out"]), personas=tuple(p for p in options["personas"].split(",") if p),
                group=not options["no_group"], group_control=not options["no_group_control"],
                batch_size=options["batch_size"], turns_per_session=options["turns_per_session"],
                overrides=json.loads(options["overrides"]), eval_temperature=options["eval_temperature"],
                target=options["target"], stop_at_target=options["stop_at_target"],
                update_timeout=options["update_timeout"],
            )
        except (ValueError, json.JSONDecodeError) as exc:
            raise CommandError(str(exc)) from exc
        # One line per request would bury the progress lines.
        for name in ("httpx", "httpx2"):  # the openai SDK logs through the latter
            logging.getLogger(name).setLevel(logging.WARNING)
        bench = Bench(config, echo=lambda line: self.stdout.write(line),
                      log=lambda line: self.stderr.write(line))
        try:
            bench.run()
        except BenchError as exc:
            raise CommandError(str(exc)) from exc
        finally:
            if bench.tracks:
                png = bench.write_outputs()
                target = bench_plot_path()
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copyfile(png, target)
                self.stderr.write(f"plot: {png} (and {target} for the dashboard)")
            bench.close()
