"""A slot per test run: its own PostgreSQL database name and its own pair of Redis databases.

Redis has 16 numbered databases, so there are 8 slots (pairs 0/1 … 14/15). The first run on a machine gets
slot 7 (databases 14 and 15, as before) and an unsuffixed database name; a run that starts while others are
going takes the next free slot. A slot is held by an flock on a file in the temp folder for as long as the
run's main process lives, so a killed run frees its slot at once. The choice travels to subprocesses (Celery
workers, servers) in CLAWHUB_TEST_SLOT; an explicit DATABASE_URL / REDIS_URL / CELERY_BROKER_URL still wins.
"""

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

SLOTS = 8
# Test-only, so not a deployment setting: read through this name rather than listed in deploy/env.example.
SLOT_VARIABLE = "CLAWHUB_TEST_SLOT"
_held: list = []  # the open lock file of the slot this process claimed: closing it would free the slot


@dataclass(frozen=True)
class Slot:
    number: int

    @property
    def suffix(self) -> str:
        return "" if self.number == SLOTS - 1 else f"_s{self.number}"

    @property
    def cache_db(self) -> int:
        return 2 * self.number

    @property
    def broker_db(self) -> int:
        return 2 * self.number + 1


def claim_test_slot() -> Slot:
    inherited = os.environ.get(SLOT_VARIABLE)
    if inherited is not None:
        return Slot(int(inherited))
    folder = Path(tempfile.gettempdir())
    for number in reversed(range(SLOTS)):
        handle = open(folder / f"clawhub-test-slot-{number}.lock", "w")  # noqa: SIM115 (held open on purpose)
        try:
            fcntl.flock(handle, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            handle.close()
            continue
        _held.append(handle)
        os.environ[SLOT_VARIABLE] = str(number)
        return Slot(number)
    raise RuntimeError(f"all {SLOTS} test slots are taken: {SLOTS} test runs are going on already")
