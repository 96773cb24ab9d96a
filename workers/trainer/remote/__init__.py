"""Training backends that run on a remote service: Tinker and Fireworks' serverless trainers.

Both implement workers.trainer.backend.TrainingBackend and speak the same plain dataclasses as the local
backend; they are registered by name in workers.trainer.registry, which the Django side reads to pick one per
site or tenant. Each reads its credentials from the settings it is given (``from_config``), or takes them as
options:

    backend = backend_for("tinker", api_key=..., base_url=...)       # workers.trainer.registry
    backend = backend_for("fireworks", api_key=..., account_id=..., base_url=...)

Importing this package imports no SDK (and no torch): the classes are imported on use.
"""

from workers.trainer.remote.errors import RemoteAuthError, RemoteTrainingError

__all__ = ["RemoteAuthError", "RemoteTrainingError"]
