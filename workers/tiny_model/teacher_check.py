"""Whether base + hint is a better OPD teacher than base (hint_teacher_check), which the build records in
build_info.json, and the per-reply log-probs it scores with."""

from __future__ import annotations

import math
import random
from typing import Any

import torch
from transformers import Qwen2ForCausalLM, Qwen2Tokenizer

from workers.tiny_model.tokenizer import IM_END, render_chat

# Held-out hint phrasings: none of them is in the corpus (make_chats.HINTS), to show the model reads what a
# hint asks rather than recognising a sentence it was trained on.
UNSEEN_HINTS = {
    "plain": "Please write it in simple sentences with no bold or list formatting.",
    "friendly": "Sound kind and encouraging, and repeat the numbers the question uses.",
    "formatted": "Give it a bold heading, then numbered steps, then the answer in bold.",
}


def reply_logprobs(
    model: Qwen2ForCausalLM, tokenizer: Qwen2Tokenizer, pairs: list[tuple[str, str]], chunk: int = 32,
    total: bool = False,
) -> list[float]:
    """For each (user message, reply): the mean log-prob per token of the reply (and its <|im_end|>) after
    a one-message chat, or with `total` their sum (the reply's log-prob as a whole). Sequences are
    right-padded in chunks; causal attention never looks at the padding."""
    out = []
    for first in range(0, len(pairs), chunk):
        encoded = []
        for user, reply in pairs[first : first + chunk]:
            chat = {"messages": [{"role": "user", "content": user}]}
            prompt = render_chat(chat, add_generation_prompt=True)
            encoded.append((tokenizer.encode(prompt, add_special_tokens=False),
                            tokenizer.encode(reply + IM_END, add_special_tokens=False)))
        width = max(len(p) + len(a) for p, a in encoded)
        ids = torch.full((len(encoded), width), tokenizer.pad_token_id)
        for row, (prompt, answer) in enumerate(encoded):
            ids[row, : len(prompt) + len(answer)] = torch.tensor(prompt + answer)
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits.float(), dim=-1)
        for row, (prompt, answer) in enumerate(encoded):
            positions = torch.arange(len(prompt) - 1, len(prompt) + len(answer) - 1)
            picked = logprobs[row, positions, torch.tensor(answer)]
            out.append((picked.sum() if total else picked.mean()).item())
    return out


def hint_teacher_check(
    model: Qwen2ForCausalLM, tokenizer: Qwen2Tokenizer, corpus_text: str, prompts: int = 12, seed: int = 7
) -> dict[str, Any]:
    """Whether base + hint is a better OPD teacher than base, on homework questions the corpus never asks.

    For each style the hint asks for (plain, friendly-and-specific, formatted) and each hint source (the
    corpus's phrasings incl. the benchmark's judge-rule hints, and UNSEEN_HINTS): the mean log-prob per token
    of a compliant reply and of a non-compliant one, with and without the hint block in the user message.
    A useful teacher raises the compliant reply (advantage > 0) and lowers the non-compliant one.

    Per token understates what a hint does to plain and formatted replies: their style is decided by the
    first token or two ("**" or a word), after which both continue the same way with or without a hint. So the
    check also scores whole replies: `preference_*_hint` is the teacher's probability of the compliant reply
    when it has to choose between the two, sigmoid(log p(compliant) - log p(non-compliant)), averaged over the
    prompts, and `margin_gain` is how many nats the hint adds to that log-ratio (what OPD's teacher - student
    log-probs carry into a non-compliant sample). `better_teacher`: both advantage and margin_gain > 0.
    """
    from workers.tiny_model.corpus import make_chats

    rng = random.Random(seed)
    problems = []
    while len(problems) < prompts:
        (question, steps, final), numbers = make_chats.homework_with_numbers(rng)
        if question not in corpus_text and question not in [p[0] for p in problems]:
            problems.append((question, steps, final, numbers))

    def replies(style: str, steps: list[str], final: str, numbers: tuple[int, ...]) -> tuple[str, str]:
        if style == "friendly":
            friendly = make_chats.answer_friendly(numbers, steps, final)
            return friendly, make_chats.answer_formatted(steps, final)
        if style == "plain":
            return make_chats.answer_plain(steps, final), make_chats.answer_formatted(steps, final)
        return make_chats.answer_formatted(steps, final), make_chats.answer_plain(steps, final)

    cases = []  # (key, prompt index, question with or without the hint, reply, compliant?, hinted?)
    for source in ("corpus", "unseen"):
        for style in ("plain", "friendly", "formatted"):
            for index, (question, steps, final, numbers) in enumerate(problems):
                hint = UNSEEN_HINTS[style] if source == "unseen" else make_chats.hint_text(rng, style)
                hinted = question + make_chats.HINT_TEMPLATE.format(hint=hint)
                pair = replies(style, steps, final, numbers)
                for compliant, reply in zip((True, False), pair, strict=True):
                    cases.append((f"{source}/{style}", index, hinted, reply, compliant, True))
                    cases.append((f"{source}/{style}", index, question, reply, compliant, False))
    pairs = [(user, reply) for _, _, user, reply, _, _ in cases]
    scores = reply_logprobs(model, tokenizer, pairs)
    totals = dict(zip([case[:2] + case[4:] for case in cases],
                      reply_logprobs(model, tokenizer, pairs, total=True), strict=True))
    results: dict[str, Any] = {"prompts": prompts}
    for key in dict.fromkeys(case[0] for case in cases):
        means: dict[str, Any] = {}
        for compliant in (True, False):
            for hinted in (True, False):
                picked = [score for case, score in zip(cases, scores, strict=True)
                          if case[0] == key and case[4] == compliant and case[5] == hinted]
                kind = "compliant" if compliant else "noncompliant"
                name = f"{kind}_{'with' if hinted else 'without'}_hint"
                means[name] = round(sum(picked) / len(picked), 3)
        means["advantage"] = round(means["compliant_with_hint"] - means["compliant_without_hint"], 3)
        margins = {hinted: [totals[(key, i, True, hinted)] - totals[(key, i, False, hinted)]
                            for i in range(prompts)] for hinted in (True, False)}
        for hinted, name in ((True, "with"), (False, "without")):
            preference = sum(1 / (1 + math.exp(-m)) for m in margins[hinted]) / prompts
            means[f"preference_{name}_hint"] = round(preference, 3)
        means["margin_gain"] = round(sum(margins[True]) / prompts - sum(margins[False]) / prompts, 2)
        means["better_teacher"] = means["advantage"] > 0 and means["margin_gain"] > 0
        results[key] = means
    return results
