"""Strict JSON input for the REST API: a JSON value of another type than the field's is refused (400), never
coerced, so the server takes what the OpenAPI document says and nothing else (``name: 0``, ``reason: 0``,
``training_enabled: 0``, ``"5"`` for an integer were stored as "0", "0", false and 5).

DRF's fields coerce on purpose, for HTML forms and query strings, where every value is text; those (a
``QueryDict``) keep DRF's rules. Installed once, by ``CoreConfig.ready``, on DRF's own field classes, so every
serializer (and every subclass: SlugField, EmailField, ...) gets it without naming a field class of ours.
"""

from django.http import QueryDict
from rest_framework import fields

_installed = False


def _from_json(field: fields.Field) -> bool:
    # A field's root is the serializer given the request's data; a form or a query string is a QueryDict.
    return not isinstance(getattr(field.root, "initial_data", None), QueryDict)


def _strict(field_class: type[fields.Field], accepts, error: str) -> None:
    lenient = field_class.to_internal_value

    def to_internal_value(self, data):
        if _from_json(self) and not accepts(self, data):
            self.fail(error, input=data)
        return lenient(self, data)

    to_internal_value.__doc__ = f"DRF's, after refusing a JSON value that is not {error!r} for this field."
    field_class.to_internal_value = to_internal_value


def _integer(_field, data) -> bool:
    return (isinstance(data, int) and not isinstance(data, bool)) or (
        isinstance(data, float) and data.is_integer())


def _choice(field, data) -> bool:
    # Choices that are all strings take strings; others (numbers) keep DRF's matching by text.
    values = field.choice_strings_to_values.values()
    return isinstance(data, str) or not all(isinstance(value, str) for value in values)


def install() -> None:
    global _installed
    if _installed:
        return
    _installed = True
    _strict(fields.CharField, lambda _f, data: isinstance(data, str), "invalid")
    _strict(fields.BooleanField, lambda _f, data: isinstance(data, bool), "invalid")
    _strict(fields.IntegerField, _integer, "invalid")
    _strict(fields.ChoiceField, _choice, "invalid_choice")
