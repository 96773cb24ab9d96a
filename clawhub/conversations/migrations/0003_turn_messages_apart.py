"""Existing turns: messages out of ``request`` into what each adds to its base, links by continuation, endings.

Session by session, in index order: a main turn whose messages extend an earlier turn's prompt + reply (its
continuation hash) gets that turn as parent and base; the rest keep all their messages. Runs in batches of
sessions so that a large table does not need one huge transaction's memory.
"""

from django.db import migrations

BATCH = 200


def _ended(turn) -> str:
    if turn.status == "failed":
        return "upstream_error" if turn.http_status >= 500 else ""
    if turn.status == "cut":
        return "client_disconnect" if turn.http_status == 499 else "upstream_error"
    choice = turn.response[0] if turn.response and isinstance(turn.response[0], dict) else {}
    finish = choice.get("finish_reason")
    if finish == "length":
        return "length"
    message = choice.get("message") if isinstance(choice.get("message"), dict) else {}
    return "tool_calls" if finish == "tool_calls" or message.get("tool_calls") else "stop"


def forwards(apps, schema_editor):
    from clawhub.conversations.identity import next_state_messages, prefix_hashes, prompt_hash
    from clawhub.conversations.storage import split_messages

    Session = apps.get_model("conversations", "Session")
    Turn = apps.get_model("conversations", "Turn")
    session_ids = list(Session.objects.order_by("id").values_list("id", flat=True))
    for start in range(0, len(session_ids), BATCH):
        chunk = session_ids[start:start + BATCH]
        turns = list(Turn.objects.filter(session_id__in=chunk).order_by("session_id", "index"))
        by_session: dict[int, list] = {}
        for turn in turns:
            by_session.setdefault(turn.session_id, []).append(turn)
        changed = []
        for session_turns in by_session.values():
            prompts: dict[int, list] = {}
            by_continuation: dict[str, object] = {}
            for turn in session_turns:
                request = dict(turn.request or {})
                messages = request.get("messages")
                turn.ended = _ended(turn)
                if turn.route != "chat" or not isinstance(messages, list):
                    changed.append(turn)
                    continue
                parent = None
                candidates = prefix_hashes(messages)
                if turn.turn_type == "main":
                    turn.prompt_hash = prompt_hash(messages)
                    turn.parent_hash = candidates[0] if candidates else ""
                    turn.follows = next_state_messages(messages) or None
                    for digest in candidates:
                        if digest in by_continuation:
                            parent = by_continuation[digest]
                            break
                if parent is not None:
                    turn.parent_id = parent.pk
                    turn.link = "next" if parent.next_state is not None else "fork"
                base = prompts.get(parent.pk) if parent is not None else None
                turn.messages_shared, turn.messages_added = split_messages(messages, base)
                turn.prompt_base_id = parent.pk if parent is not None and turn.messages_shared else None
                request.pop("messages")
                turn.request = request
                prompts[turn.pk] = messages
                if turn.turn_type == "main" and turn.continuation_hash:
                    by_continuation[turn.continuation_hash] = turn
                changed.append(turn)
        Turn.objects.bulk_update(
            changed,
            ["request", "messages_shared", "messages_added", "prompt_base", "prompt_hash", "parent_hash",
             "follows", "parent", "link", "ended"],
            batch_size=500,
        )


def backwards(apps, schema_editor):
    from clawhub.conversations.storage import Rebuilder, Stored

    Turn = apps.get_model("conversations", "Turn")
    session_ids = list(Turn.objects.order_by().values_list("session_id", flat=True).distinct())
    for start in range(0, len(session_ids), BATCH):
        turns = list(Turn.objects.filter(session_id__in=session_ids[start:start + BATCH]))
        rows = {t.pk: Stored(t.prompt_base_id, t.messages_shared, t.messages_added,
                             (t.request or {}).get("messages"), 0, None, None, None) for t in turns}
        rebuild = Rebuilder(rows)
        for turn in turns:
            if turn.messages_added:
                turn.request = {**(turn.request or {}), "messages": rebuild.messages(turn.pk)}
        Turn.objects.bulk_update(turns, ["request"], batch_size=500)


class Migration(migrations.Migration):
    dependencies = [("conversations", "0002_turn_links_storage")]

    operations = [migrations.RunPython(forwards, backwards)]
