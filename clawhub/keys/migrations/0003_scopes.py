import clawhub.keys.models
from django.db import migrations, models


def existing_keys_inference_only(apps, schema_editor):
    # Keys made before scopes existed acted as full account credentials; they keep only what they were
    # made for. An owner who scripts the REST API with one ticks the scopes it needs on the key page.
    apps.get_model("keys", "ApiKey").objects.update(scopes=["inference"])


class Migration(migrations.Migration):

    dependencies = [
        ('keys', '0002_apikey_training_enabled'),
    ]

    operations = [
        migrations.AddField(
            model_name='apikey',
            name='scopes',
            field=models.JSONField(blank=True, default=clawhub.keys.models.default_scopes),
        ),
        migrations.RunPython(existing_keys_inference_only, migrations.RunPython.noop),
    ]
