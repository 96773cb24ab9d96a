"""``model_update``: the one way services write "set the fields that changed, save only those" (after
HackSoft's Django Styleguide), so each service says what it changes and what it audits, not how a row is
saved."""

from collections.abc import Iterable, Mapping
from typing import Any

from django.db import models


def model_update(
    *, instance: models.Model, fields: Iterable[str], data: Mapping[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """Sets each of ``fields`` that ``data`` holds and whose value differs on the saved ``instance``, then
    saves those fields only (with the model's ``auto_now`` fields, which Django refreshes on every save).
    Returns ``{field: (old, new)}`` for the fields that changed, in ``fields`` order: empty, and nothing
    saved, when none did. Validation stays with the service, before the call: it raises the project's errors
    with their codes, which a ``full_clean`` here would not."""
    changed: dict[str, tuple[Any, Any]] = {}
    for field in fields:
        if field not in data:
            continue
        old, new = getattr(instance, field), data[field]
        if old != new:
            setattr(instance, field, new)
            changed[field] = (old, new)
    if changed:
        auto_now = [f.name for f in instance._meta.concrete_fields if getattr(f, "auto_now", False)]
        instance.save(update_fields=[*changed, *(f for f in auto_now if f not in changed)])
    return changed
