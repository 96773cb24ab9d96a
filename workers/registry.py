"""Classes registered once by name as ``"module:Class"`` (workers/judge/registry.py: judges,
workers/trainer/registry.py: training backends). A class is imported only when it is looked up, so reading the
names imports nothing heavy."""

import importlib


def registered_class(table: dict[str, str], name: str, *, base: type, kind: str) -> type:
    """The class ``table`` registers under ``name``, checked to be the subclass of ``base`` of that name; a
    clear error for a name that is not registered."""
    try:
        module, _, attr = table[name].partition(":")
    except KeyError:
        raise ValueError(f"unknown {kind} {name!r}: one of {', '.join(table)}") from None
    cls = getattr(importlib.import_module(module), attr)
    if not (isinstance(cls, type) and issubclass(cls, base)) or cls.name != name:
        raise TypeError(f"{table[name]} is not the {base.__name__} named {name!r}")
    return cls
