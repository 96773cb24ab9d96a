"""A slot per test process: its own PostgreSQL database name and its own pair of Redis databases.

Redis has 16 numbered databases, so there are 8 slots (pairs 0/1 … 14/15). The first run on a machine gets
slot 7 (databases 14 and 15, as before) and an unsuffixed database name; a run that starts while others are
going takes the next free slot. A slot is held by an flock on a file in the temp folder for as long as the
process that claimed it lives, so a killed run frees its slot at once.

The choice travels to subprocesses (Celery workers, servers) in CLAWHUB_TEST_SLOT, together with the
pytest-xdist worker that claimed it. An xdist worker inherits its controller's variables but claims a slot of
its own: two workers sharing a Redis database would clear each other's cache between tests and take each
other's Celery tasks. The database, cache and broker URLs a slot implies are set here; an explicit
DATABASE_URL / REDIS_URL / CELERY_BROKER_URL (one no slot implied) still wins.
"""

import fcntl
import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

SLOTS = 8
# Test-only, so not deployment settings: read through these names rather than listed in deploy/env.example.
SLOT_VARIABLE = "CLAWHUB_TEST_SLOT"
OWNER_VARIABLE = "CLAWHUB_TEST_SLOT_WORKER"  # the xdist worker ("gw0", …; "" outside xdist) that claimed it
XDIST_WORKER_VARIABLE = "PYTEST_XDIST_WORKER"  # set by pytest-xdist in each worker process
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

    def urls(self) -> dict[str, str]:
        return {
            "DATABASE_URL": f"postgres://postgres@127.0.0.1:5432/clawhub{self.suffix}",
            "REDIS_URL": f"redis://127.0.0.1:6379/{self.cache_db}",
            "CELERY_BROKER_URL": f"redis://127.0.0.1:6379/{self.broker_db}",
        }


def claim_test_slot() -> Slot:
    """This process's slot: the one its parent passed down (same xdist worker), or a free one it locks."""
    worker = os.environ.get(XDIST_WORKER_VARIABLE, "")
    inherited = os.environ.get(SLOT_VARIABLE)
    if inherited is not None and os.environ.get(OWNER_VARIABLE, "") == worker:
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
        os.environ[OWNER_VARIABLE] = worker
        return Slot(number)
    raise RuntimeError(f"all {SLOTS} test slots are taken: {SLOTS} test processes are going on already")


def use_test_slot() -> Slot:
    """Claims this process's slot and points the database, cache and broker URLs at it, unless set by hand."""
    inherited = os.environ.get(SLOT_VARIABLE)
    implied_before = Slot(int(inherited)).urls() if inherited is not None else {}
    slot = claim_test_slot()
    for name, url in slot.urls().items():
        current = os.environ.get(name)
        if current is None or current == implied_before.get(name):
            os.environ[name] = url
    return slot
