"""The training claim is one foreign key, Sample.training_run: what deleting a run and the migration do."""

import importlib

import pytest
from django.apps import apps

from clawhub.review.models import Sample
from tests.factories import make_run, make_user
from tests.review.conftest import approved_sample

pytestmark = pytest.mark.django_db


def test_deleting_a_run_keeps_its_samples_and_drops_only_the_claim():
    user = make_user()
    sample = approved_sample(user)
    run = make_run(user.tenant)
    Sample.objects.filter(pk=sample.pk).update(training_run=run)
    assert list(run.samples.all()) == [sample]
    run.delete()
    sample.refresh_from_db()
    assert sample.training_run_id is None and sample.state == Sample.State.APPROVED


def test_the_migration_clears_claims_of_runs_that_no_longer_exist_and_keeps_the_others():
    migration = importlib.import_module("clawhub.review.migrations.0003_sample_training_run_foreign_key")
    user = make_user()
    kept, orphan, free = approved_sample(user), approved_sample(user), approved_sample(user)
    run = make_run(user.tenant)
    Sample.objects.filter(pk=kept.pk).update(training_run=run)
    # PostgreSQL checks the constraint at commit (deferred), so a claim of a missing run can exist in here.
    Sample.objects.filter(pk=orphan.pk).update(training_run_id=run.pk + 1000)
    migration.clear_claims_of_missing_runs(apps, None)
    ids = [kept.pk, orphan.pk, free.pk]
    claims = dict(Sample.objects.filter(pk__in=ids).values_list("pk", "training_run"))
    assert claims == {kept.pk: run.pk, orphan.pk: None, free.pk: None}
