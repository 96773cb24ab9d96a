from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Benchmark the trainer's update step (tokens/s, seconds per step, peak memory) for each objective "
        "against the plainest reference loop; one JSON line per objective. See workers/trainer/bench.py."
    )

    def add_arguments(self, parser):
        # Imported here, not at module level: Django imports every command module to list them, and the web
        # process must never import torch. The options live with the benchmark so both entry points agree.
        from workers.trainer.bench import add_arguments

        add_arguments(parser)

    def handle(self, *args, model_shape, objectives, steps, threads, **options):
        from workers.trainer.bench import bench

        try:
            bench(
                model_shape=model_shape,
                objectives=tuple(o.strip() for o in objectives.split(",") if o.strip()),
                steps=steps,
                threads=threads,
                log=self.stdout.write,
            )
        except (RuntimeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
