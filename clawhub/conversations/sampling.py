"""How a turn's reply was sampled, recorded with the turn so the trainer can score the policy that sampled it.

The request's ``temperature`` / ``top_p`` / ``top_k`` where the client sent them; otherwise what the server
used instead. vLLM (``--generation-config auto``, its default) takes those defaults from the model's
``generation_config.json``, and its neutral values (1.0, 1.0, off) where that file has none; the vLLM that
``manage.py serve`` starts overrides the temperature with the model description's (workers/base_models.py,
``--override-generation-config``); an operator whose server is started otherwise says so with
``CLAWHUB_SERVED_SAMPLING``. ``logprobs_mode`` is what the
server's log-probs are (``CLAWHUB_VLLM_LOGPROBS_MODE``, vLLM's ``--logprobs-mode``): with
``processed_logprobs`` they are of the distribution sampled from (after temperature, top-k, top-p), and the
trainer can use them as pi_old at any temperature.
"""

import functools
import json
import math
from pathlib import Path
from typing import Any

from django.conf import settings

from workers import base_models

NEUTRAL = {"temperature": 1.0, "top_p": 1.0, "top_k": 0}


def served_defaults() -> dict[str, float | int]:
    """The sampling the server applies to a request that names none: CLAWHUB_SERVED_SAMPLING over the model
    description's temperature over the base model's generation_config.json over vLLM's neutral values."""
    overrides = settings.CLAWHUB_SERVED_SAMPLING or {}
    return dict(_served_defaults(settings.CLAWHUB_BASE_MODEL, json.dumps(overrides, sort_keys=True)))


@functools.lru_cache(maxsize=8)
def _served_defaults(base_model: str, overrides: str) -> tuple[tuple[str, float | int], ...]:
    # Read once per setting, not once per captured turn.
    defaults = dict(NEUTRAL)
    try:
        from_model = json.loads((Path(base_model) / "generation_config.json").read_text())
    except (OSError, ValueError):
        from_model = {}
    described = {"temperature": base_models.describe(base_model).temperature}
    for source in (from_model, described, json.loads(overrides)):
        defaults.update({k: source[k] for k in NEUTRAL if source.get(k) is not None})
    return tuple(_normalised(defaults).items())


def _normalised(values: dict[str, Any]) -> dict[str, float | int]:
    top_k = int(values["top_k"])
    return {
        "temperature": float(values["temperature"]),
        "top_p": float(values["top_p"]),
        "top_k": top_k if top_k > 0 else 0,  # vLLM: 0 and -1 both mean off
    }


def turn_sampling(request: dict[str, Any]) -> dict[str, Any]:
    """{"temperature", "top_p", "top_k", "logprobs_mode", "defaulted": [the names the request left out]} for
    a request as sent. A value of the wrong type is recorded as the server's default would be, which is not
    what the server did (it refuses such a request): such a turn has no reply to train on anyway."""
    defaults = served_defaults()
    values, defaulted = {}, []
    for name, default in defaults.items():
        value = request.get(name)
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
            value = default
            defaulted.append(name)
        values[name] = value
    mode = settings.CLAWHUB_VLLM_LOGPROBS_MODE
    return {**_normalised(values), "logprobs_mode": mode, "defaulted": defaulted}
