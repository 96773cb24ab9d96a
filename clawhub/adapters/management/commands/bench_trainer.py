from django.core.management.base import BaseCommand, CommandError


class Command(BaseCommand):
    help = (
        "Benchmark the trainer's update step (tokens/s, seconds per step, peak memory) for each objective "
        "against the plainest reference loop; one JSON line per objective. --tenants 1,8,32: tenant "
        "updates per hour, fresh process vs resident base vs multi-tenant passes "
        "(see workers/trainer/bench.py). --lora-kernels --tenants 1,8,32: one LoRA layer's kernels and time "
        "per forward + backward vs tenants and spans, per-span vs grouped."
    )

    def add_arguments(self, parser):
        # Imported here, not at module level: Django imports every command module to list them, and the web
        # process must never import torch. The options live with the benchmark so both entry points agree.
        from workers.trainer.bench_cli import add_arguments

        add_arguments(parser)

    def handle(
        self, *args, model_shape, objectives, steps, threads, tenants="", lora_kernels=False, **options
    ):
        from workers.trainer.bench import bench
        from workers.trainer.bench_cli import parse_tenants, run_lora_kernels
        from workers.trainer.bench_tenants import bench_tenants

        try:
            if lora_kernels:
                run_lora_kernels(tenants or "1,8,32", threads=threads or 1, log=self.stdout.write)
                return
            if tenants:
                bench_tenants(tenants=parse_tenants(tenants), threads=threads or 1, log=self.stdout.write)
                return
            bench(
                model_shape=model_shape,
                objectives=tuple(o.strip() for o in objectives.split(",") if o.strip()),
                steps=steps,
                threads=threads,
                log=self.stdout.write,
            )
        except (RuntimeError, ValueError) as exc:
            raise CommandError(str(exc)) from exc
