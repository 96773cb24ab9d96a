"""Errors of the remote training backends, raised after their own bounded retries are spent, and the bounds
those retries keep (RetryPolicy)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any


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


@dataclass(frozen=True)
class RetryPolicy:
    """Bounds on waiting for the service. Each remote call waits at most call_timeout_s; a call that failed
    transiently (429, 5xx, timeout, lost connection) is retried up to `attempts` times in all, sleeping
    backoff_s, 2*backoff_s, ... (capped at max_backoff_s) in between. The SDKs retry too, underneath: these
    bounds are the ones the run actually keeps."""

    attempts: int = 4
    backoff_s: float = 2.0
    max_backoff_s: float = 30.0
    call_timeout_s: float = 600.0

    def delay(self, attempt: int) -> float:
        return min(self.backoff_s * 2 ** (attempt - 1), self.max_backoff_s)

    @classmethod
    def from_config(cls, config: Any) -> RetryPolicy:
        """From the CLAWHUB_REMOTE_* settings (attributes of ``config``)."""
        return cls(
            attempts=max(1, config.CLAWHUB_REMOTE_RETRY_ATTEMPTS),
            backoff_s=config.CLAWHUB_REMOTE_RETRY_BACKOFF,
            max_backoff_s=max(config.CLAWHUB_REMOTE_RETRY_BACKOFF, 30.0),
            call_timeout_s=config.CLAWHUB_REMOTE_CALL_TIMEOUT,
        )
