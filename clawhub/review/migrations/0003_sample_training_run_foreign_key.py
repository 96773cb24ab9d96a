"""Sample.training_run_id, an integer column, becomes the foreign key Sample.training_run on the same column.

Claims of runs that no longer exist are cleared first (the constraint would refuse them); every other claim is
kept as it is. The column keeps its name, so no data moves.
"""

import django.db.models.deletion
from django.db import migrations, models


def clear_claims_of_missing_runs(apps, schema_editor):
    Sample = apps.get_model("review", "Sample")
    TrainingRun = apps.get_model("training", "TrainingRun")
    Sample.objects.filter(training_run_id__isnull=False).exclude(
        training_run_id__in=TrainingRun.objects.values("pk")
    ).update(training_run_id=None)


class Migration(migrations.Migration):

    dependencies = [
        ("review", "0002_consensus_and_influence"),
        ("training", "0002_lineage"),
    ]

    operations = [
        migrations.RunPython(clear_claims_of_missing_runs, migrations.RunPython.noop),
        migrations.SeparateDatabaseAndState(
            # The database: the same column, now with the constraint and an index.
            database_operations=[
                migrations.AlterField(
                    model_name="sample",
                    name="training_run_id",
                    field=models.ForeignKey(
                        blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                        related_name="samples", to="training.trainingrun", db_column="training_run_id",
                    ),
                ),
            ],
            # Django's picture: the integer field is gone and the foreign key (column training_run_id) is there.
            state_operations=[
                migrations.RemoveField(model_name="sample", name="training_run_id"),
                migrations.AddField(
                    model_name="sample",
                    name="training_run",
                    field=models.ForeignKey(
                        blank=True, null=True, on_delete=django.db.models.deletion.SET_NULL,
                        related_name="samples", to="training.trainingrun",
                    ),
                ),
            ],
        ),
    ]
