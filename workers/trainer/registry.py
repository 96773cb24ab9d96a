"""Training backends by name, each registered once as ``"module:Class"``. The choices of a run's and a
tenant's backend (clawhub.training.models.Backend), CLAWHUB_TRAIN_BACKEND's validation and the train task's
factory all read this table, so a new backend is a ``TrainingBackend`` subclass with ``name`` and
``from_config`` plus one line here (and a choices-only migration of clawhub/training, which Django asks for
whenever choices change; names are at most 12 characters, the width of TrainingRun.backend).

Classes are imported on use: naming a backend imports no SDK and no torch (the web process reads the names).
"""

import importlib
from typing import Any

from workers.trainer.backend import TrainingBackend

BACKENDS: dict[str, str] = {
    "local": "workers.trainer.local:LocalBackend",
    "tinker": "workers.trainer.remote.tinker:TinkerBackend",
    "fireworks": "workers.trainer.remote.fireworks:FireworksBackend",
}


def backend_names() -> list[str]:
    return list(BACKENDS)


def backend_class(name: str) -> type[TrainingBackend]:
    """The class registered under ``name``; a clear error for a name that is not registered."""
    try:
        module, _, attr = BACKENDS[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown training backend {name!r}; known: {', '.join(BACKENDS)}") from None
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, TrainingBackend)) or cls.name != name:
        raise TypeError(f"{BACKENDS[name]} is not the TrainingBackend named {name!r}")
    return cls


def backend_for(name: str, **options: Any) -> TrainingBackend:
    """A backend by name with explicit options (tests, scripts): remote ones take api_key (required),
    base_url and their own options (see each class); the local one takes none. Credentials live only on the
    instance: they are never logged nor written to the workdir."""
    return backend_class(name)(**options)


def backend_from_config(name: str, config: Any) -> TrainingBackend:
    """The backend the train task uses: ``config`` has the settings as attributes (Django's settings, or any
    object); each class reads its own (``TrainingBackend.from_config``)."""
    return backend_class(name).from_config(config)
