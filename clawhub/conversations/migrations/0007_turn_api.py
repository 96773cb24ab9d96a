from django.db import migrations, models


def _completions_rows(apps, schema_editor):
    # Completions turns are known by their route. Turns that came through Messages or Responses before this
    # field stay "chat": their records did not say which API they came through.
    Turn = apps.get_model("conversations", "Turn")
    Turn.objects.filter(route="completions").update(api="completions")


class Migration(migrations.Migration):

    dependencies = [
        ("conversations", "0006_turn_continuation_without_retry"),
    ]

    operations = [
        migrations.AddField(
            model_name="turn",
            name="api",
            field=models.CharField(choices=[("chat", "Chat Completions"), ("completions", "Completions"),
                                            ("messages", "Anthropic Messages"),
                                            ("responses", "OpenAI Responses")],
                                   default="chat", max_length=16),
        ),
        migrations.RunPython(_completions_rows, migrations.RunPython.noop),
    ]
