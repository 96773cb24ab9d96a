"""Simulates the consensus guard on scripted groups and prints how fast it flags an adversary and how often it
flags an honest member (devtools.consensus_sim)."""

from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = "Simulate the consensus guard: time to flag an adversary, honest members flagged, per group kind."

    def add_arguments(self, parser):
        parser.add_argument("--groups", default="HHA,HHH,HHHAA",
                            help="comma-separated groups, one letter per member: H honest, A adversary")
        parser.add_argument("--noise", default="0.1,0.2", help="comma-separated reaction noise rates")
        parser.add_argument("--runs", type=int, default=100)
        parser.add_argument("--sessions", type=int, default=14, help="sessions per member in a run")
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, groups, noise, runs, sessions, seed, **options):
        from clawhub.devtools.consensus_sim import report, simulate

        kinds = groups.split(",")
        if any(not roles or set(roles) - {"H", "A"} for roles in kinds):
            raise CommandError(f"--groups {groups!r}: each group is a string of H (honest) and A (adversary)")
        try:
            rates = [float(n) for n in noise.split(",")]
        except ValueError:
            raise CommandError(f"--noise {noise!r}: comma-separated rates, e.g. 0.1,0.2") from None
        if any(not 0 <= r < 0.5 for r in rates) or runs < 1 or sessions < 1:
            raise CommandError("--noise rates are in [0, 0.5); --runs and --sessions at least 1")
        for roles in kinds:
            for rate in rates:
                self.stdout.write(report(simulate(roles, noise=rate, runs=runs, sessions=sessions,
                                                  seed=seed)))
