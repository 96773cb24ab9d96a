"""Errors of the remote training backends, raised after their own bounded retries are spent."""

from __future__ import annotations


class RemoteTrainingError(RuntimeError):
    """The remote service could not complete the run (after retries, or a non-retryable refusal).

    `transient` says whether retrying the whole run later may succeed (5xx, 429, timeouts, lost connections),
    so the train task can choose between "failed, samples back to the pool" and a later retry."""

    def __init__(self, message: str, *, backend: str, transient: bool = False) -> None:
        super().__init__(message)
        self.backend = backend
        self.transient = transient


class RemoteAuthError(RemoteTrainingError):
    """The service refused the credentials (401/403). Never retried: a wrong key does not become right."""

    def __init__(self, message: str, *, backend: str) -> None:
        super().__init__(message, backend=backend, transient=False)
