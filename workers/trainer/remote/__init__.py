"""Training backends that run on a remote service: Tinker and Fireworks' serverless trainers.

Both implement workers.trainer.backend.TrainingBackend and speak the same plain dataclasses as the local
backend; the Django side picks one per site or tenant and passes credentials it read from the environment or a
secret setting:

    backend = backend_for("tinker", api_key=settings.TINKER_API_KEY, base_url=settings.TINKER_BASE_URL)
    backend = backend_for("fireworks", api_key=..., account_id=..., base_url=...)
    backend = backend_for("local")

Names map to "module:Class" and are imported on use, so naming a backend imports no SDK (and no torch).
"""

from __future__ import annotations

import importlib
from typing import Any

from workers.trainer.backend import TrainingBackend
from workers.trainer.remote.errors import RemoteAuthError, RemoteTrainingError

REMOTE_BACKENDS: dict[str, str] = {
    "tinker": "workers.trainer.remote.tinker:TinkerBackend",
    "fireworks": "workers.trainer.remote.fireworks:FireworksBackend",
}
BACKEND_NAMES = ("local", *REMOTE_BACKENDS)

__all__ = ["BACKEND_NAMES", "RemoteAuthError", "RemoteTrainingError", "backend_for"]


def backend_for(name: str, **credentials: Any) -> TrainingBackend:
    """A ready-to-start backend by name ("local", "tinker", "fireworks").

    Remote backends take api_key (required), base_url, and their own options (see each class); the local one
    takes none. Credentials live only on the instance: they are never logged nor written to the workdir."""
    if name == "local":
        from workers.trainer.backend import load_backend

        return load_backend("local")(**credentials)
    try:
        target = REMOTE_BACKENDS[name]
    except KeyError:
        raise ValueError(f"unknown training backend {name!r}; known: {', '.join(BACKEND_NAMES)}") from None
    module, _, attr = target.partition(":")
    return getattr(importlib.import_module(module), attr)(**credentials)
