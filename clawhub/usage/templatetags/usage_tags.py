"""Usage on the key pages. The keys app sits below usage in the layers (usage counts what keys did), so its
views cannot ask for usage; its templates load these tags instead, and every read goes through the usage
selectors, scoped to the user who owns the keys."""

from django import template

from clawhub.usage.selectors import usage_default_range, usage_of_key, usage_of_keys

register = template.Library()


@register.simple_tag
def keys_with_usage(keys, user) -> list[tuple]:
    """``(key, sums or None)`` for each key, over the usage page's default range."""
    keys = list(keys)
    since, until = usage_default_range()
    sums = usage_of_keys(user=user, key_ids=[key.pk for key in keys], since=since, until=until)
    return [(key, sums.get(key.pk)) for key in keys]


@register.simple_tag
def key_usage(key, user) -> dict:
    since, until = usage_default_range()
    return usage_of_key(user=user, key_id=key.pk, since=since, until=until)


@register.simple_tag
def usage_days() -> int:
    """How many days the figures above cover (the usage page's default range, today included)."""
    since, until = usage_default_range()
    return (until - since).days + 1
