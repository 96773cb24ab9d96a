"""Capture on the embedded default: SQLite, in a separate process (the suite itself runs on PostgreSQL)."""

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

SCRIPT = """
import django, time
django.setup()
from django.core.management import call_command
call_command("migrate", verbosity=0)
from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Session, Turn
from clawhub.conversations.capture.records import TurnRecord
from tests.factories import make_key, make_user

owner = make_user("sqlite@example.com")
key, _ = make_key(owner)

def record(n, messages, reply):
    return TurnRecord(
        request_id=f"r{n}", route="chat", key_id=key.pk, user_id=owner.pk, tenant_id=owner.tenant.pk,
        group_id=None, model="clawhub-personal", upstream_model="tiny", adapter_version_id=None,
        upstream="http://127.0.0.1:1", status="complete", http_status=200, started_at=time.time() + n,
        latency_ms=5.0, session_id="s1", turn_type="main",
        request={"messages": messages}, choices=[{"message": {"role": "assistant", "content": reply}}],
        prompt_tokens=3, completion_tokens=2,
    )

first = [{"role": "user", "content": "Explain photosynthesis."}]
capture_store([record(1, first, "Plants make sugar from light.")])
second = first + [{"role": "assistant", "content": "Plants make sugar from light."},
                  {"role": "user", "content": "Thanks! Now explain respiration."}]
capture_store([record(2, second, "Cells burn sugar for energy.")])
session = Session.objects.get()
turns = list(Turn.objects.order_by("index"))
assert session.turn_count == 2, session.turn_count
assert [t.index for t in turns] == [0, 1]
assert turns[0].next_state[0]["content"] == "Thanks! Now explain respiration.", turns[0].next_state
print("ok")
"""


def test_capture_links_turns_on_the_embedded_sqlite_database(tmp_path):
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("DJANGO_", "DATABASE_URL", "REDIS_URL", "CELERY_"))}
    env.update(DJANGO_SETTINGS_MODULE="clawhub.settings.base", CLAWHUB_DATA_DIR=str(tmp_path))
    result = subprocess.run([sys.executable, "-c", SCRIPT], cwd=ROOT, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stdout.strip().endswith("ok")
