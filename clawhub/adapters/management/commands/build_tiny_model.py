import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = (
        "Build the tiny Qwen2 model (tokenizer trained on workers/trainer/corpus, short CPU pre-training) "
        "that tests, CI and the embedded default serve through vLLM. The result is committed under models/."
    )

    def add_arguments(self, parser):
        parser.add_argument("--out", default=str(Path(settings.BASE_DIR) / "models" / "tiny-qwen2"))
        parser.add_argument("--steps", type=int, default=500)
        parser.add_argument("--seed", type=int, default=0)

    def handle(self, *args, out, steps, seed, **options):
        # Imported here, not at module level: Django imports every command module to list them, and the web
        # process must never import torch.
        from workers.trainer.tiny_model import TinyModelConfig, build_tiny_model

        summary = build_tiny_model(
            out, TinyModelConfig(steps=steps, seed=seed), log=lambda line: self.stdout.write(line)
        )
        self.stdout.write(json.dumps({k: v for k, v in summary.items() if k != "config"}))
        self.stdout.write(self.style.SUCCESS(f"tiny model written to {out}"))
