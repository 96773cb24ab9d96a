from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Benchmark the promotion gate on the train worker: seconds per gate on a chain of versions, scoring "
        "the way it did before (a private base per gate, everything afresh) and now (the resident base, a "
        "version's canaries and perplexity measured once), and a check that both give the same numbers "
        "(see workers/trainer/gate_bench.py)."
    )

    def add_arguments(self, parser):
        # Imported here, not at module level: the web process must never import torch.
        from workers.trainer.gate_bench import add_arguments

        add_arguments(parser)

    def handle(self, *args, model, gates, samples, threads, device, **options):
        from workers.trainer.gate_bench import bench

        try:
            bench(model=model, gates=gates, samples=samples, threads=threads, device=device,
                  log=self.stdout.write)
        except (RuntimeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
