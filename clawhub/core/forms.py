"""Helpers for server-rendered forms."""

from django import forms

from clawhub.core.exceptions import ClawHubError

# Services name the fields as the API does; the forms split a new password into two inputs.
_FORM_FIELD = {"password": "new_password1", "new_password": "new_password1"}


def form_add_service_error(form: forms.Form, exc: ClawHubError) -> None:
    """Shows a service's error on the form: its per-field messages (``data["fields"]``) on the fields the form
    has; failing that, its message on the one field it names (``data["field"]``); else on top of the form."""
    placed = False
    for name, messages in (exc.data.get("fields") or {}).items():
        field = _FORM_FIELD.get(name, name)
        if field in form.fields:
            for message in messages:
                form.add_error(field, message)
            placed = True
    if placed:
        return
    field = _FORM_FIELD.get(exc.data.get("field"), exc.data.get("field"))
    form.add_error(field if field in form.fields else None, exc.message)
