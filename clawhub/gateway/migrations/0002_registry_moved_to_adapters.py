"""The registry's models moved to the adapters app (adapters 0004): they leave the gateway's state only; their
tables stay, now the adapters app's."""

from django.db import migrations


class Migration(migrations.Migration):

    dependencies = [
        ('gateway', '0001_initial'),
        ('adapters', '0004_upstream_loadedadapter'),
    ]

    operations = [
        migrations.SeparateDatabaseAndState(
            state_operations=[
                migrations.DeleteModel(name='LoadedAdapter'),
                migrations.DeleteModel(name='Upstream'),
            ],
            database_operations=[],
        ),
    ]
