"""The tiny Qwen2 model the project builds for itself (``python manage.py build_tiny_model``): test and
development material, not part of the trainer.

builder.py        model, pre-training, build, and random LoRA adapters for it
tokenizer.py      its tokenizer and chat template
teacher_check.py  whether base + hint is a better OPD teacher than base (recorded at each build)
corpus/           what it is trained on; the promotion gate's canaries for this model are chats of it

It imports nothing else of the project, so the trainer (its gate and benchmarks), the tests and the
management commands may all use it.
"""
