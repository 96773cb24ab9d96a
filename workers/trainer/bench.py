"""Update-step throughput of the local backend, per objective, against the plainest reference loop.

    python manage.py bench_trainer                          # tiny model, CPU (or GPU if present)
    python -m workers.trainer.bench_cli --model-shape qwen3-4b  # Qwen3-4B-shaped, random weights, bf16,
                                                                # CUDA only
    python manage.py bench_trainer --tenants 1,8,32         # tenant updates/hour: fresh process, resident
                                                            # sequential, resident multi-tenant batched
    python manage.py bench_trainer --lora-kernels --tenants 1,8,32  # one LoRA layer of a pass: kernels and
                                                            # time vs tenants and spans, per-span vs grouped

Multi-tenant mode (--tenants): N tenants with one ready batch each; see bench_tenants.py.

A "step" is one train() call that makes one optimizer step over a batch: preparing pi_old / teacher /
reference log-probs where the objective needs them, the micro-batched forward/backward, the optimizer step and
the checkpoint. The reference does the same maths the plainest way: one sample at a time, full-vocabulary
logits over the whole sequence, a teacher forward per sample, no checkpoint. One JSON line per objective.

MFU counts model FLOPs, not hardware FLOPs: a forward is 2 * (layer matmul params) per token plus the LM head
at the positions it runs on plus causal attention (2 * T^2 * d_attn per layer); a LoRA backward is 2x its
forward (activation gradients only: the base weights are frozen, so the usual 6N becomes 4N per token).
"""

from __future__ import annotations

import json
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, cast

import torch

from workers.trainer.backend import Method, TrainConfig, TrainSample
from workers.trainer.batching import prompt_ids, with_hint
from workers.trainer.forward import generate_samples, load_pretrained
from workers.trainer.local import LocalBackend
from workers.trainer.losses import clipped_surrogate, kl_k3
from workers.trainer.measure import PeakMemory, forward_flops, qwen3_4b_loader, release_freed_memory_to_os

REPO = Path(__file__).resolve().parents[2]
TINY_MODEL_DIR = REPO / "models" / "tiny-qwen2"
H200_BF16_PEAK_FLOPS = 790e12
HINT = "Write plain sentences: no bold text and no numbered lists."


@dataclass
class Shape:
    name: str
    batch_samples: int
    micro_batch_size: int
    prompt_tokens: int | None  # None: the corpus prompts as they are
    response_tokens: int


SHAPES = {
    "tiny": Shape("tiny", batch_samples=16, micro_batch_size=8, prompt_tokens=None, response_tokens=128),
    # 2k-token sequences: 1k of prompt, 1k of response.
    "qwen3-4b": Shape(
        "qwen3-4b", batch_samples=8, micro_batch_size=2, prompt_tokens=1024, response_tokens=1024
    ),
}


# ---------------------------------------------------------------------------------------------- samples


def make_samples(backend: LocalBackend, shape: Shape, seed: int) -> list[TrainSample]:
    """A batch like the gateway records: prompts, responses with their ids and log-probs, rewards +-1, and a
    hint on half of them."""
    from workers.tiny_model.builder import load_corpus

    paragraphs, chats = load_corpus()
    prompts = []
    for chat in chats:
        first_user = next(i for i, m in enumerate(chat["messages"]) if m["role"] == "user")
        prompts.append(chat["messages"][: first_user + 1])
    prompts = prompts[: shape.batch_samples]
    tok = backend.tokenizer
    if shape.prompt_tokens is None:
        sampled = generate_samples(
            backend.model, tok, prompts, max_new_tokens=shape.response_tokens, temperature=1.0, seed=seed
        )
        responses = [(s.token_ids, s.logprobs) for s in sampled]
    else:
        # Long synthetic turns: the prompt padded with corpus prose, the response random tokens of the tiny
        # vocabulary; their log-probs come from one prefill of the untrained policy, as vLLM would report.
        filler = tok.encode(" ".join(paragraphs), add_special_tokens=False)
        prompts = [
            [{"role": "user", "content": tok.decode(filler[i * 7 : i * 7 + shape.prompt_tokens - 30])}]
            for i in range(len(prompts))
        ]
        generator = torch.Generator().manual_seed(seed)
        ids = torch.randint(10, len(tok) - 10, (len(prompts), shape.response_tokens), generator=generator)
        ids = [row.tolist() for row in ids]
        texts = [
            tok.decode(row, skip_special_tokens=False, clean_up_tokenization_spaces=False) for row in ids
        ]
        # Decoding then re-encoding is not the identity for random ids; keep ids that survive a round trip.
        ids = [tok.encode(t, add_special_tokens=False) for t in texts]
        responses = []
        for prompt, row in zip(prompts, ids, strict=True):
            logp = backend._forward([(_prompt_ids(tok, prompt), row)])[0][0, : len(row)].tolist()
            responses.append((row, logp))
    samples = []
    for i, (prompt, (ids, logprobs)) in enumerate(zip(prompts, responses, strict=True)):
        body = [t for t in ids if t not in (tok.eos_token_id, tok.pad_token_id)]
        text = tok.decode(body, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        samples.append(
            TrainSample(
                sample_id=f"bench-{i}",
                messages=prompt,
                response_text=text,
                response_token_ids=ids,
                response_logprobs=logprobs,
                reward=1 if i % 2 == 0 else -1,
                hints=[HINT] if i % 4 < 2 else [],
            )
        )
    return samples


def _prompt_ids(tokenizer: Any, messages: list[dict[str, Any]]) -> list[int]:
    return prompt_ids(tokenizer, messages, None)


# ---------------------------------------------------------------------------------------------- the loops


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize()


def optimized_step(backend: LocalBackend, samples: list[TrainSample], call: int) -> dict[str, float]:
    """One train() call (one optimizer step) on a fresh copy of the batch's ids, so nothing is cached."""
    batch = [
        TrainSample(**{**vars(s), "sample_id": f"{s.sample_id}-{call}", "hints": list(s.hints)})
        for s in samples
    ]
    _sync(backend.device)
    started = time.perf_counter()
    result = backend.train(batch)
    _sync(backend.device)
    seconds = time.perf_counter() - started
    update = sum(m.seconds for m in result.metrics)
    return {"seconds": seconds, "update_seconds": update, "steps": len(result.metrics)}


def reference_step(backend: LocalBackend, samples: list[TrainSample]) -> float:
    """The same objective, the plainest way: per sample, full logits, a teacher per sample, one step."""
    cfg, model, tok, device = backend.config, backend.model, backend.tokenizer, backend.device
    _sync(device)
    started = time.perf_counter()
    model.train()
    backend.zero_grad()
    for sample in samples:  # only samples with a signal for this objective (the caller filters)
        prompt = _prompt_ids(tok, sample.messages)
        response = list(_response_ids(sample))
        ids = torch.tensor([prompt + response], device=device)
        targets = ids[0, len(prompt) :]

        def logp_of(sequence: torch.Tensor, start: int, targets: torch.Tensor = targets) -> torch.Tensor:
            logits = model(input_ids=sequence).logits[0].float()
            logp = torch.log_softmax(logits, -1)[start - 1 : -1]
            return logp.gather(-1, targets[:, None])[:, 0]

        logp_new = logp_of(ids, len(prompt))
        logp_old = torch.tensor(sample.response_logprobs, device=device)
        advantage = torch.zeros_like(logp_old)
        if cfg.method in ("rl", "combine"):
            advantage = advantage + cfg.w_rl * sample.reward
        if cfg.method in ("opd", "combine") and sample.hints:
            hinted = _prompt_ids(tok, with_hint(sample.messages, sample.hints[0]))
            with torch.no_grad(), model.disable_adapter():
                teacher = logp_of(torch.tensor([hinted + response], device=device), len(hinted))
            advantage = advantage + cfg.w_opd * (teacher - logp_old)
        loss = clipped_surrogate(logp_new, logp_old, advantage, cfg.eps_low, cfg.eps_high).mean()
        if cfg.kl_coef > 0:
            with torch.no_grad(), model.disable_adapter():
                ref = logp_of(ids, len(prompt))
            loss = loss + cfg.kl_coef * kl_k3(logp_new, ref).mean()
        (loss / len(samples)).backward()
    backend.step_optimizer()
    _sync(device)
    return time.perf_counter() - started


# ---------------------------------------------------------------------------------------------- driver


def _response_ids(sample: TrainSample) -> list[int]:
    assert sample.response_token_ids is not None  # make_samples gives every reply its sampled ids
    return sample.response_token_ids


def trains(method: str, sample: TrainSample) -> bool:
    """Whether the objective has any signal for this sample (the backend drops the others)."""
    return {"rl": sample.reward != 0, "opd": bool(sample.hints)}.get(
        method, sample.reward != 0 or bool(sample.hints)
    )


def bench(
    *,
    model_shape: str = "tiny",
    objectives: tuple[str, ...] = ("rl", "opd", "combine"),
    steps: int = 3,
    threads: int | None = None,
    log=print,
) -> list[dict[str, Any]]:
    shape = SHAPES[model_shape]
    if model_shape != "tiny" and not torch.cuda.is_available():
        raise RuntimeError(
            f"--model-shape {model_shape} needs a CUDA GPU (a ~4B-parameter model in bf16 with 2k-token "
            "sequences); torch.cuda.is_available() is False here, and it will not be tried on CPU"
        )
    if threads:
        torch.set_num_threads(threads)
    loader = load_pretrained if model_shape == "tiny" else qwen3_4b_loader(TINY_MODEL_DIR)
    results = []
    for method in objectives:
        # TrainConfig refuses a method outside Method with the list of those it knows.
        config = TrainConfig(
            method=cast(Method, method), micro_batch_size=shape.micro_batch_size, lr=1e-5, seed=0
        )
        with tempfile.TemporaryDirectory(prefix="bench-trainer-") as workdir:
            backend = LocalBackend(model_loader=loader)
            backend.start(str(TINY_MODEL_DIR), None, config, workdir)
            if backend.device.type == "cpu":
                release_freed_memory_to_os()
            samples = make_samples(backend, shape, seed=0)
            trained = [s for s in samples if trains(method, s)]
            tok = backend.tokenizer
            lengths = [(len(_prompt_ids(tok, s.messages)), len(_response_ids(s))) for s in trained]
            tokens = sum(p + r for p, r in lengths)

            optimized_step(backend, samples, call=-1)  # warm-up (allocator, kernels)
            with PeakMemory(backend.device) as memory:
                timings = [optimized_step(backend, samples, call=i) for i in range(steps)]
            reference_step(backend, trained)  # warm-up
            with PeakMemory(backend.device) as reference_memory:
                reference = [reference_step(backend, trained) for _ in range(steps)]
            seconds = sum(t["seconds"] for t in timings) / steps
            ref_seconds = sum(reference) / steps

            teacher_lengths = [
                (len(_prompt_ids(tok, with_hint(s.messages, s.hints[0]))), len(_response_ids(s)))
                for s in trained
                if s.hints and method != "rl"
            ]
            # Forward + 2x forward for the LoRA backward, plus the teachers' prefill.
            flops = 3 * forward_flops(backend.model, lengths, False) + forward_flops(
                backend.model, teacher_lengths, False
            )
            row = {
                "objective": method,
                "model": model_shape,
                "device": str(backend.device),
                "dtype": str(backend.dtype).removeprefix("torch."),
                "threads": torch.get_num_threads(),
                "batch_samples": len(samples),
                "trained_samples": len(trained),
                "micro_batch_size": shape.micro_batch_size,
                "tokens_per_step": tokens,
                "seconds_per_step": round(seconds, 4),
                "update_seconds": round(sum(t["update_seconds"] for t in timings) / steps, 4),
                "tokens_per_s": round(tokens / seconds, 1),
                "peak_mem_mb": round(memory.peak_mb, 1),
                "reference_seconds_per_step": round(ref_seconds, 4),
                "reference_tokens_per_s": round(tokens / ref_seconds, 1),
                "reference_peak_mem_mb": round(reference_memory.peak_mb, 1),
                "speedup_vs_reference": round(ref_seconds / seconds, 2),
                "model_tflops_per_step": round(flops / 1e12, 4),
            }
            if backend.device.type == "cuda":
                row["gpu"] = torch.cuda.get_device_name(backend.device)
                row["mfu"] = round(flops / seconds / H200_BF16_PEAK_FLOPS, 4)
                row["reference_mfu"] = round(flops / ref_seconds / H200_BF16_PEAK_FLOPS, 4)
            backend.close()
        log(json.dumps(row))
        results.append(row)
    return results
