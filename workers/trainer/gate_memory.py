"""What the promotion gate holds in memory beyond the model's weights, as a formula of the model's shape, and
that formula checked against a measurement on the CPU (no GPU needed):

    python -m workers.trainer.gate_memory             # the estimate for Qwen3-4B in bf16, then the check

The gate (workers/trainer/gate.py) scores on the resident base (no private copy) and its largest transient
tensors are, per part, with b the weights' bytes per element, N = PASS_TOKENS padded tokens per forward
pass, C = HEAD_CHUNK_TOKENS response positions per pass through the LM head, V the vocabulary, M the models
it scores (candidate and parent):

    log-prob pass   N (3 ff + 4 d) b          the decoder's MLP (gate, up, their product) and residual,
                                              norm and attention output of one layer (no gradient, so one
                                              layer's activations at a time)
    log-prob head   C V (b + 4 + 4)           the logits, their float32 copy (none when b = 4) and
                                              logsumexp's float32 temporary
    KL part         C V (4 (M + 4) + b)       the teacher's and each model's float32 log-softmax of one chunk,
                    + (M + 1) N d b           the products' temporaries, the head's output; the last hidden
                                              states of a pass's replies, teacher's and each model's (at
                                              most N positions)
    canaries        R (P + G) 2 L h_kv d_h b  the KV cache of one batched generate: R prompts of P tokens,
                                              G new ones, L layers of h_kv heads of size d_h

and the peak is the largest of the four. Before the gate was chunked, the log-prob head held 8 whole
replies' positions at once (C = 8 T for replies of T tokens) and the KL part one whole hinted reply's
(C = T): 23 GiB and 7.5 GiB at T = 2,048 for a 4B model in bf16.

The check builds a small model of the same family with random weights, runs the log-prob and KL parts under
a fixed malloc threshold (every large tensor is its own mapping, returned on free) and reads the peak resident
size the kernel records (VmHWM, reset before each part through /proc/self/clear_refs).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
from typing import Any

from workers.trainer.capability import GATE_MAX_TOKENS, QUESTIONS
from workers.trainer.gate import HEAD_CHUNK_TOKENS, PASS_TOKENS

QWEN3_4B = {"hidden_size": 2560, "intermediate_size": 9728, "vocab_size": 151936, "num_hidden_layers": 36,
            "num_key_value_heads": 8, "head_dim": 128}
# The check's shape: the same family, small enough for a CPU, the vocabulary large enough that the head's
# chunks are the largest tensors, as at 4B.
SMALL = {"hidden_size": 256, "intermediate_size": 1024, "vocab_size": 64000, "num_hidden_layers": 2,
         "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 64}
# The capability questions: 53 prompts of 43 to 48 tokens (SmolLM2's template), GATE_MAX_TOKENS new ones.
CAPABILITY_ROWS, CAPABILITY_PROMPT_TOKENS, CAPABILITY_NEW_TOKENS = len(QUESTIONS), 48, GATE_MAX_TOKENS
MiB = 2**20


def estimate(shape: dict[str, int], *, dtype_bytes: int, models: int = 2, pass_tokens: int = PASS_TOKENS,
             chunk: int = HEAD_CHUNK_TOKENS, response_tokens: int | None = None,
             pass_response_tokens: int | None = None) -> dict[str, int]:
    """Bytes of each part's largest transient tensors (the module docstring's formulas) and the peak.
    response_tokens: the longest reply, when shorter than a head chunk; pass_response_tokens: the reply
    positions in a pass (at most pass_tokens, the default)."""
    b, d, ff, vocab = dtype_bytes, shape["hidden_size"], shape["intermediate_size"], shape["vocab_size"]
    c = min(chunk, response_tokens) if response_tokens else chunk
    parts = {
        "logprob_pass": pass_tokens * (3 * ff + 4 * d) * b,
        "logprob_head": c * vocab * (b + (4 if b != 4 else 0) + 4),
        "kl": (c * vocab * (4 * (models + 4) + (b if b != 4 else 0))
               + (models + 1) * (pass_tokens if pass_response_tokens is None else pass_response_tokens)
               * d * b),
        "canaries": (CAPABILITY_ROWS * (CAPABILITY_PROMPT_TOKENS + CAPABILITY_NEW_TOKENS) * 2
                     * shape["num_hidden_layers"] * shape["num_key_value_heads"] * shape["head_dim"] * b),
    }
    return {**parts, "peak": max(parts.values())}


def before(shape: dict[str, int], *, dtype_bytes: int, samples: int, response_tokens: int,
           models: int = 2) -> dict[str, int]:
    """What the unchunked gate held at once: the head's tensors for every position of 8 samples' replies
    (log-probs), and of one hinted reply for the teacher and each model (KL): the formulas above with C = the
    whole reply (8 of them for the log-probs)."""
    whole = estimate(shape, dtype_bytes=dtype_bytes, models=models, chunk=response_tokens,
                     pass_response_tokens=0)
    return {"logprob": min(samples, 8) * whole["logprob_head"], "kl": whole["kl"]}


def _status(field: str) -> int:
    with open("/proc/self/status") as f:
        # Linux lists every field it is asked for here.
        return int(re.search(rf"{field}:\s+(\d+)", f.read()).group(1)) * 1024  # type: ignore[union-attr]


def _peak(fn) -> int:
    """Peak resident bytes above the current ones while fn runs."""
    import gc

    gc.collect()
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # resets VmHWM to the current resident size
    start = _status("VmRSS")
    fn()
    return _status("VmHWM") - start


def measure(
    shape: dict[str, int], *, prompt_tokens: int, response_tokens: int, samples: int
) -> dict[str, int]:
    """The log-prob and KL parts' measured peaks on a random-weight model of `shape` (float32, CPU); run in a
    process started with the malloc settings of check()."""
    import torch

    from workers.trainer import gate
    from workers.trainer.backend import TrainSample
    from workers.trainer.bench import TINY_MODEL_DIR
    from workers.trainer.measure import qwen3_4b_loader

    torch.set_num_threads(1)
    model, tokenizer = qwen3_4b_loader(TINY_MODEL_DIR, **shape)("random", torch.float32, torch.device("cpu"))
    tokenizer.pad_token = tokenizer.pad_token or tokenizer.eos_token
    for p in model.parameters():
        p.requires_grad_(False)

    class Encoded:  # what the scorer reads of an encoded sample (ids below the small vocabulary)
        def __init__(self, i: int):
            self.prompt_ids = list(range(100, 100 + prompt_tokens))
            self.response_ids = list(range(200, 200 + response_tokens))
            self.sample = TrainSample(sample_id=i, messages=[{"role": "user", "content": "?"}],
                                      response_text="", hints=["hint"])

    encoded = [Encoded(i) for i in range(samples)]
    scorer = gate._Scorer(model, tokenizer, torch.device("cpu"), prompt_tokens + response_tokens)
    # A stand-in with the real one's arguments, only for this measurement.
    gate.teacher_prompt_ids = lambda tok, e, hint, max_seq_len: (  # type: ignore[assignment, misc]
        e.prompt_ids + [7, 8, 9], None)
    adapters: dict[str, str | None] = {"candidate": None, "parent": None}
    scores = {name: gate.ModelScores() for name in adapters}
    with torch.no_grad():
        scorer.mean_logprobs(encoded[:1], budget=1)  # first-call allocations (thread pools, caches) aside
        logprob = _peak(lambda: scorer.mean_logprobs(encoded))
        kl = _peak(lambda: gate._hint_teacher_scores(scorer, tokenizer, encoded, scores, adapters=adapters,
                                                      max_seq_len=10**6))
    return {"logprob": logprob, "kl": kl}


def check(*, prompt_tokens: int = 512, response_tokens: int = 512, samples: int = 8) -> dict[str, Any]:
    """measure() in a child process with a fixed malloc threshold (glibc otherwise keeps freed tensors in
    its heap, where a later part reuses them unseen), next to estimate() for the same shape in float32."""
    env = {**os.environ, "MALLOC_MMAP_THRESHOLD_": "65536", "MALLOC_TRIM_THRESHOLD_": "0"}
    code = (f"import json; from workers.trainer.gate_memory import measure, SMALL; print(json.dumps(measure("
            f"SMALL, prompt_tokens={prompt_tokens}, response_tokens={response_tokens}, samples={samples})))")
    out = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True)
    measured = json.loads(out.stdout.strip().splitlines()[-1])
    expected = estimate(SMALL, dtype_bytes=4, response_tokens=response_tokens,
                        pass_response_tokens=min(samples, PASS_TOKENS // (prompt_tokens + response_tokens))
                        * response_tokens)
    pass_tokens = min(PASS_TOKENS, samples * (prompt_tokens + response_tokens))
    decoder = estimate(SMALL, dtype_bytes=4, pass_tokens=pass_tokens)["logprob_pass"]
    estimated = {"logprob": max(decoder, expected["logprob_head"]), "kl": expected["kl"]}
    return {
        "shape": SMALL, "samples": samples, "prompt_tokens": prompt_tokens,
        "response_tokens": response_tokens,
        **{f"{part}_MiB": {"estimate": round(estimated[part] / MiB, 1),
                           "measured": round(measured[part] / MiB, 1)} for part in ("logprob", "kl")},
        "before_MiB": {k: round(v / MiB, 1) for k, v in before(
            SMALL, dtype_bytes=4, samples=samples, response_tokens=response_tokens).items()},
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-check", action="store_true", help="print the 4B estimate only")
    args = parser.parse_args()
    gib = 2**30
    four_b = estimate(QWEN3_4B, dtype_bytes=2)
    print(json.dumps({"shape": "qwen3-4b", "dtype": "bfloat16", "pass_tokens": PASS_TOKENS,
                      "head_chunk_tokens": HEAD_CHUNK_TOKENS,
                      "estimate_GiB": {k: round(v / gib, 2) for k, v in four_b.items()},
                      "before_GiB (replies of 2,048 tokens)": {
                          k: round(v / gib, 1) for k, v in before(QWEN3_4B, dtype_bytes=2, samples=32,
                                                                  response_tokens=2048).items()}}))
    if not args.no_check:
        print(json.dumps(check()))


if __name__ == "__main__":
    main()
