"""Reads for a user's own data: their samples as they see them, and everything ClawHub holds about them, as
the export gives it.

Only about the user: rows where they acted on someone else keep what they did, never the other person's name
or details.
"""

from typing import Any

from django.db.models import Q, QuerySet

from clawhub.accounts.models import AuditLog, User, UserSession
from clawhub.groups.models import Membership
from clawhub.keys.selectors import keys_for_user
from clawhub.review.models import Sample


def samples_for_user(*, user: User) -> QuerySet[Sample]:
    """The user's own samples, wherever they were made (their adapter, their groups'), newest first."""
    return (Sample.objects.select_related("tenant__group", "tenant__user", "user", "key", "decided_by")
            .filter(user=user).order_by("-created_at", "-id"))


def _audit_row_for_export(row: AuditLog, user: User) -> dict:
    """An audit row about the user. Rows where the user acted on someone else keep only what the user did:
    the other person's name and the row's details are theirs, not this user's."""
    about_user = row.subject_user_id in (None, user.pk)
    return {
        "id": row.pk,
        "created_at": row.created_at,
        "action": row.action,
        "by": "you" if row.actor_id == user.pk else ("someone else" if row.actor_id else "system"),
        "target_type": row.target_type,
        "target_id": row.target_id,
        "target": row.target_repr if about_user else "",
        "group": row.group.slug if row.group_id else None,  # type: ignore[union-attr]  # group_id is set
        "ip": row.ip if row.actor_id == user.pk else None,
        "data": row.data if about_user else {},
    }


def user_data_export(*, user: User) -> dict[str, Any]:
    """Everything ClawHub holds about the user, as plain JSON-ready data, and nothing about anyone else:
    their profile, keys (never secrets or digests), memberships, where they are signed in, sessions, turns,
    judgments, samples, usage and the audit rows that concern them."""
    from clawhub.conversations.models import Session, Turn
    from clawhub.feedback.models import Judgment
    from clawhub.usage.models import UsageDaily

    keys = [
        {"id": k.pk, "name": k.name, "display": k.display, "group": k.group.slug if k.group_id else None,  # type: ignore[union-attr]  # group_id is set
         "allowed_models": k.allowed_models, "rpm_limit": k.rpm_limit, "tpm_limit": k.tpm_limit,
         "concurrency_limit": k.concurrency_limit, "expires_at": k.expires_at, "revoked_at": k.revoked_at,
         "last_used_at": k.last_used_at, "created_at": k.created_at, "training_enabled": k.training_enabled,
         "playground": k.playground}
        for k in keys_for_user(user=user, with_playground=True)
    ]
    memberships = [
        {"group": {"id": m.group_id, "slug": m.group.slug, "name": m.group.name}, "role": m.role,
         "joined_at": m.created_at}
        for m in Membership.objects.filter(user=user).select_related("group").order_by("created_at", "pk")
    ]
    sessions = list(Session.objects.filter(user=user).order_by("started_at", "pk").values(
        "id", "tenant_id", "key_id", "external_id", "inferred", "started_at", "last_activity_at", "closed_at",
        "close_reason", "turn_count"))
    turns = list(Turn.objects.filter(user=user).order_by("created_at", "pk").values(
        "id", "session_id", "tenant_id", "key_id", "index", "turn_type", "request_id", "route", "model",
        "request", "response", "token_ids", "logprobs", "prompt_tokens", "completion_tokens", "status",
        "http_status", "latency_ms", "ttft_ms", "error", "created_at", "next_state", "next_state_at",
        "closed_without_next", "ended", "link", "parent_id", "regenerate_of_id"))
    # The messages are stored as what each turn added to its parent's: the export has every prompt whole.
    from clawhub.conversations.selectors import stored_prompts

    prompts = stored_prompts(session_ids={t["session_id"] for t in turns})
    for t in turns:
        messages = prompts.get(t["id"], (None,))[0]
        if t["route"] == "chat" and messages is not None and "messages" not in (t["request"] or {}):
            t["request"] = {**(t["request"] or {}), "messages": messages}
    judgments = list(Judgment.objects.filter(turn__user=user).order_by("created_at", "pk").values(
        "id", "turn_id", "reward", "votes", "hints", "judge", "prompt_version", "raw_outputs", "status",
        "created_at"))
    samples = list(Sample.objects.filter(user=user).order_by("created_at", "pk").values(
        "id", "turn_id", "tenant_id", "key_id", "reward", "has_hint", "state", "flags", "decided_at",
        "reason", "trained_at", "created_at"))
    from clawhub.feedback.models import ExplicitFeedback

    # Ratings the user gave (on their own turns, or as a reviewer on a group's) and ratings of their turns.
    explicit = list(ExplicitFeedback.objects.filter(Q(rated_by=user) | Q(turn__user=user)).order_by(
        "created_at", "pk").values("id", "turn_id", "tenant_id", "key_id", "source", "thumb", "score",
                                   "comment", "demonstration", "created_at", "updated_at"))
    usage = list(UsageDaily.objects.filter(user=user).order_by("day", "pk").values(
        "day", "key_id", "tenant_id", "model", "requests", "errors", "prompt_tokens", "completion_tokens",
        "latency_ms_sum", "streams"))
    # Where they are signed in (not the session keys: a key is a credential).
    sign_ins = list(UserSession.objects.filter(user=user).order_by("created_at", "pk").values(
        "created_at", "last_seen_at", "ip", "user_agent"))
    audit = [
        _audit_row_for_export(row, user)
        for row in AuditLog.objects.filter(Q(actor=user) | Q(subject_user=user)).select_related("group")
        .order_by("created_at", "pk")
    ]
    return {
        "format": "clawhub-export/1",
        "profile": {
            "id": user.pk, "email": user.email, "display_name": user.display_name,
            "date_joined": user.date_joined, "last_login": user.last_login,
            "email_verified_at": user.email_verified_at, "is_staff": user.is_staff,
            "training_enabled": user.training_enabled, "store_turns": user.store_turns,
        },
        "keys": keys,
        "memberships": memberships,
        "signed_in": sign_ins,
        "sessions": sessions,
        "turns": turns,
        "judgments": judgments,
        "samples": samples,
        "explicit_feedback": explicit,
        "usage": usage,
        "audit": audit,
    }
