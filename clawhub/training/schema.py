"""The OpenAPI description of a tenant's training ``overrides``: the TrainConfig fields a tenant may set, each
with the range ``TrainConfig`` itself accepts and, for the settings that decide how long a run holds a worker,
the operator's upper bound (``CLAWHUB_TRAIN_UPPER_BOUNDS`` over the built-in ones)."""

from django.conf import settings

from workers.trainer.backend import DEFAULT_UPPER_BOUNDS, DTYPES, LOWER_BOUNDS


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
            "target_modules": {"type": "array", "minItems": 1,
                               "items": {"type": "string", "minLength": 1, "maxLength": 100}},
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
            "seed": {"type": "integer"},
            "dtype": {"type": "string", "enum": list(DTYPES)},
            "device": {"anyOf": [{"type": "string", "enum": ["auto", "cpu", "cuda", "mps"]},
                                 {"type": "string", "pattern": "^cuda:"}]},
            "gradient_checkpointing": {"type": "boolean"},
        },
    }
