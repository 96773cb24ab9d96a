"""The tiny Qwen2 model the project builds for itself (``python manage.py build_tiny_model``): test and
development material, not part of the trainer.

builder.py  tokenizer, model, pre-training and random LoRA adapters for it
corpus/     what it is trained on; the promotion gate's canaries for this model are chats of it

It imports nothing else of the project, so the trainer (its gate and benchmarks), the tests and the
management commands may all use it.
"""
