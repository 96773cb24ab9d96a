"""`python manage.py bench_judges`: how well the rule judge and the LLM judge read the persona benchmark's
simulated users, against what the users meant (clawhub.devtools.personas.judges).

    python manage.py bench_judges                      # the rule judge only (instant)
    python manage.py bench_judges --llm --cases 8      # and the LLM judge (minutes on a CPU)

Prints one JSON object: per judge, per phrasing pool (training: what the benchmark's rules were written
against; held-out: words nothing was written against), the cases, how many the judge decided (+1 or -1), its
coverage and its agreement over the decided; and per persona the same.
"""

import json
import time

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from clawhub.devtools.personas import judges as J


class Command(BaseCommand):
    help = "Judge agreement with the persona benchmark's simulated users (rule judge, and the LLM judge)."

    def add_arguments(self, parser):
        parser.add_argument("--cases", type=int, default=24, help="cases per persona and phrasing pool")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--llm", action="store_true", help="also the LLM judge (needs a served model)")
        parser.add_argument("--llm-url", default=settings.CLAWHUB_JUDGE_BASE_URL)
        parser.add_argument("--llm-model", default=settings.CLAWHUB_JUDGE_MODEL)
        parser.add_argument("--votes", type=int, default=1, help="the LLM judge's votes per turn")
        parser.add_argument("--max-tokens", type=int, default=512, help="the LLM judge's tokens per vote")

    def handle(self, *args, cases: int, seed: int, llm: bool, llm_url: str, llm_model: str, votes: int,
               max_tokens: int, **options):
        if cases < 1:
            raise CommandError("--cases must be at least 1")
        found = J.cases(count=cases, seed=seed)
        judges = {"rule": J.rule_judge()}
        if llm:
            if not llm_url or not llm_model:
                raise CommandError("--llm needs --llm-url and --llm-model (or CLAWHUB_JUDGE_BASE_URL/_MODEL)")
            from workers.judge.judges import LLMJudge

            judges["llm"] = LLMJudge(base_url=llm_url, model=llm_model, votes=votes, hint_votes=0,
                                     temperature=settings.CLAWHUB_JUDGE_TEMPERATURE, max_tokens=max_tokens,
                                     timeout=1800, concurrency=8)
        report = {"cases_per_persona_and_pool": cases, "seed": seed}
        for name, judge in judges.items():
            began = time.monotonic()
            pairs = J.read_all(judge, found)
            report[name] = {
                "all": J.agreement(pairs),
                "by_persona": {p: J.agreement([(c, r) for c, r in pairs if c.persona == p])
                               for p in sorted({c.persona for c in found})},
                "seconds": round(time.monotonic() - began, 1),
            }
            judge.close()
        self.stdout.write(json.dumps(report, indent=2))
