"""Training's reads: the gate's held-out set is the held-back slice of succeeded runs, never a trained
sample."""

from clawhub.tenants.access import tenant_access
from clawhub.training import services as training
from clawhub.training.selectors import heldout_samples
from tests.factories import make_user
from tests.training.conftest import approved_samples


def test_the_held_out_set_is_the_held_back_slice_of_succeeded_runs(db, sent, settings):
    settings.CLAWHUB_GATE_HOLDOUT_EVERY = 2
    user = make_user()
    approved_samples(user, 4)
    run = training.run_start(tenant=user.tenant, access=tenant_access(actor=user, tenant_id=user.tenant.pk))
    assert len(run.sample_ids) == 2 and len(run.heldout_ids) == 2
    assert heldout_samples(tenant=user.tenant, limit=10) == []  # the run has not succeeded yet
    training.run_mark_running(run_id=run.pk, task_id="t")
    training.run_succeed(run_id=run.pk, metrics=[], trained_sample_ids=run.sample_ids, dropped=[],
                         resumed_from_step=None)
    held = heldout_samples(tenant=user.tenant, limit=10)
    assert sorted(s.pk for s in held) == sorted(run.heldout_ids)
    assert not set(run.sample_ids) & {s.pk for s in held}  # never a trained sample
