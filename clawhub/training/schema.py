"""A tenant's training ``overrides``: the TrainConfig fields a tenant may set, each with the range
``TrainConfig`` itself accepts and, for the settings that decide how long a run holds a worker, the operator's
upper bound (``CLAWHUB_TRAIN_UPPER_BOUNDS`` over the built-in ones). The same description is the OpenAPI
schema and what ``overrides_problems`` checks, so the two cannot disagree.

Only what tunes the tenant's own update is there. ``device``, ``dtype`` and ``target_modules`` (and the
packing sizes) are the operator's (``CLAWHUB_TRAIN_DEFAULTS``): they decide the worker's memory and the base
model it keeps resident for every tenant (a tenant's ``dtype`` or ``device`` evicted and reloaded it for all).
"""

import math

from django.conf import settings

from workers.trainer.backend import DEFAULT_UPPER_BOUNDS, LOWER_BOUNDS

SEED_MAX = 2**32 - 1  # what torch.manual_seed and numpy take


def _int(name: str, *, nullable: bool = False) -> dict:
    upper = {**DEFAULT_UPPER_BOUNDS, **settings.CLAWHUB_TRAIN_UPPER_BOUNDS}
    schema = {"type": "integer", "minimum": LOWER_BOUNDS.get(name, 0)}
    if name in upper:
        schema["maximum"] = upper[name]
    return {**schema, "nullable": True} if nullable else schema


def _unit(*, open_low: bool = False) -> dict:
    """A number in [0, 1) (or (0, 1))."""
    return {"type": "number", "minimum": 0, "exclusiveMinimum": open_low,
            "maximum": 1, "exclusiveMaximum": True}


def overrides_schema() -> dict:
    non_negative = {"type": "number", "minimum": 0}
    positive = {"type": "number", "minimum": 0, "exclusiveMinimum": True}
    return {
        "type": "object",
        "additionalProperties": False,
        "description": "TrainConfig fields over the site defaults (the method has its own field). w_opd is "
                       "above 0 here so that no method is left with nothing to train on.",
        "properties": {
            "lr": _unit(open_low=True),
            "betas": {"type": "array", "items": _unit(), "minItems": 2, "maxItems": 2},
            "weight_decay": non_negative,
            "max_grad_norm": positive,
            "lora_r": _int("lora_r"),
            "lora_alpha": _int("lora_alpha"),
            "lora_dropout": _unit(),
            "eps_low": _unit(),
            "eps_high": non_negative,
            "w_rl": non_negative,
            "w_opd": positive,
            "opd_clip": {**positive, "nullable": True},
            "kl_coef": non_negative,
            "topk_overlap": _int("topk_overlap"),
            "micro_batch_size": _int("micro_batch_size"),
            "grad_accum": _int("grad_accum", nullable=True),
            "mini_batches": _int("mini_batches"),
            "epochs": _int("epochs"),
            "old_policy": {"type": "string", "enum": ["start", "recorded"]},
            "max_version_lag": {"type": "integer", "minimum": 0, "nullable": True},
            "max_steps": _int("max_steps", nullable=True),
            "max_seq_len": _int("max_seq_len"),
            "truncate_response": {"type": "boolean"},
            "padding_side": {"type": "string", "enum": ["left", "right"]},
            "seed": {"type": "integer", "minimum": 0, "maximum": SEED_MAX},
            "gradient_checkpointing": {"type": "boolean"},
        },
    }


def _problem(name: str, value, rule: dict) -> str | None:
    """What is wrong with ``value`` under ``rule`` (a property of overrides_schema), or None."""
    kind = rule["type"]
    if value is None:
        return None if rule.get("nullable") else f"{name} may not be null"
    if kind == "boolean":
        return None if isinstance(value, bool) else f"{name} must be true or false"
    if kind == "string":
        return None if value in rule["enum"] else f"{name} must be one of {', '.join(rule['enum'])}"
    if kind == "array":
        if not isinstance(value, list) or not rule["minItems"] <= len(value) <= rule["maxItems"]:
            return f"{name} must be a list of {rule['minItems']} numbers"
        return next((p for item in value if (p := _problem(name, item, rule["items"]))), None)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return f"{name} must be a{'n integer' if kind == 'integer' else ' number'}"
    if kind == "integer" and not isinstance(value, int):
        return f"{name} must be an integer"
    low, high = rule.get("minimum"), rule.get("maximum")
    if (low is not None and (value < low or (rule.get("exclusiveMinimum") and value == low))) or (
            high is not None and (value > high or (rule.get("exclusiveMaximum") and value == high))):
        return f"{name}={value}: allowed range is {low}–{high if high is not None else '∞'}"
    return None


def overrides_problems(overrides: dict) -> list[str]:
    """What in ``overrides`` a tenant may not set: fields not in the schema, and values out of their range."""
    properties = overrides_schema()["properties"]
    problems = []
    for name, value in overrides.items():
        rule = properties.get(name)
        if rule is None:
            problems.append(f"{name} is not a setting a tenant may change (allowed: {', '.join(properties)})")
        elif problem := _problem(name, value, rule):
            problems.append(problem)
    return problems
