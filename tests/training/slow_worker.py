"""The Celery app for the kill test's workers, with each recorded training step slowed down by
$CLAWHUB_TEST_STEP_DELAY seconds, so that the test can kill the worker between two checkpoints however fast
the machine is; with $CLAWHUB_TEST_DIE_AFTER_SUCCEED the worker process dies right after a run is marked
succeeded, before the promotion is sent; with $CLAWHUB_TEST_FAIL_FIRST_RUN the first run this worker process
trains raises after its first optimizer step (its adapter attached, its optimizer holding state); with
$CLAWHUB_TEST_GATE_RELEASE (a file path) the promote task's gate takes the candidate, waits until that file
exists, and passes it (no scoring: the switch after the gate is what such a test is about).
`celery -A tests.training.slow_worker worker …`"""

import os
import time

from celery.signals import task_prerun

from workers.celery import app

__all__ = ["app"]


@task_prerun.connect
def _slow_steps(**_):
    from clawhub.training import services

    delay = float(os.environ.get("CLAWHUB_TEST_STEP_DELAY", "0"))
    record = services.run_record_step
    if not delay or getattr(record, "slowed", False):
        return

    def slowed(**kwargs):
        # After the step's checkpoint, before its progress row: the window the test kills in.
        time.sleep(delay)
        return record(**kwargs)

    slowed.slowed = True
    services.run_record_step = slowed


@task_prerun.connect
def _die_after_succeed(**_):
    from clawhub.training import services

    record = services.run_succeed
    if not os.environ.get("CLAWHUB_TEST_DIE_AFTER_SUCCEED") or getattr(record, "dying", False):
        return

    def succeed_then_die(**kwargs):
        ok = record(**kwargs)
        os._exit(1)  # the committed "succeeded", then nothing: no promote task was sent
        return ok

    succeed_then_die.dying = True
    services.run_succeed = succeed_then_die


class InjectedFailure(RuntimeError):
    pass


@task_prerun.connect
def _fail_first_run(**_):
    from clawhub.training import services

    record = services.run_record_step
    if not os.environ.get("CLAWHUB_TEST_FAIL_FIRST_RUN") or getattr(record, "failing", False):
        return
    failed: list[int] = []

    def fail_once(**kwargs):
        state = record(**kwargs)
        if not failed:
            failed.append(kwargs["run_id"])
            raise InjectedFailure("injected failure after the first step")
        return state

    fail_once.failing = True
    services.run_record_step = fail_once


@task_prerun.connect
def _gate_until_released(**_):
    import workers.tasks.promotion as task

    release = os.environ.get("CLAWHUB_TEST_GATE_RELEASE")
    if not release or getattr(task._gate, "held", False):
        return

    def gate(version):
        from clawhub.adapters import services
        from clawhub.adapters.evaluation import PROMOTE, Decision
        from clawhub.training.lineage_services import adapter_record_decision

        version = services.adapter_evaluation_start(version=version)  # the test sees "evaluating"
        # Longer than any wait of the test that holds it (a gate that passed by itself while the test still
        # waited for another worker would end the race the test is about in the other order).
        deadline = time.monotonic() + 900
        while not os.path.exists(release) and time.monotonic() < deadline:
            time.sleep(0.05)
        return adapter_record_decision(
            version=version, decision=Decision(PROMOTE, "the preference margin rose (test gate)"))

    gate.held = True
    task._gate = gate
