"""Training backends by name, each registered once as ``"module:Class"``. The choices of a run's and a
tenant's backend (clawhub.training.models.Backend), CLAWHUB_TRAIN_BACKEND's validation and the train task's
factory all read this table, so a new backend is a ``TrainingBackend`` subclass with ``name`` and
``from_config`` plus one line here (and a choices-only migration of clawhub/training, which Django asks for
whenever choices change; names are at most 12 characters, the width of TrainingRun.backend).

Classes are imported on use: naming a backend imports no SDK and no torch (the web process reads the names).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from workers.registry import registered_class

if TYPE_CHECKING:
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
    from workers.trainer.backend import TrainingBackend

    return registered_class(BACKENDS, name, base=TrainingBackend, kind="training backend")


def backend_for(name: str, **options: Any) -> TrainingBackend:
    """A backend by name with explicit options (tests, scripts): remote ones take api_key (required),
    base_url and their own options (see each class); the local one takes none. Credentials live only on the
    instance: they are never logged nor written to the workdir."""
    return backend_class(name)(**options)


def backend_from_config(name: str, config: Any) -> TrainingBackend:
    """The backend the train task uses: ``config`` has the settings as attributes (Django's settings, or any
    object); each class reads its own (``TrainingBackend.from_config``)."""
    return backend_class(name).from_config(config)
