"""The tiny model and LoRA artifacts, loaded the way a real Qwen2.5 checkpoint is (no vLLM here)."""

import json
import re

import pytest
import torch
from django.core.management import call_command
from safetensors.torch import load_file
from transformers import AutoModelForCausalLM, AutoTokenizer, Qwen2Tokenizer

from tests.specs import LORA_TARGET_MODULES, WEATHER_TOOL
from workers.tiny_model.builder import CORPUS_DIR, TinyModelConfig, load_corpus
from workers.tiny_model.tokenizer import IM_END, QWEN_SPLIT_REGEX, build_tokenizer, render_chat, train_bpe

HINT_BLOCK = "\n\n[user's hint / instruction]\n"  # what OPD appends to the last user message (backend.py)

SAMPLES = [
    "Can you help me with my homework? A garden is 5 meters long and 6 meters wide.",
    "**Solution**\n\n1. Each box holds 6 apples.\n2. We multiply.\n\n**Answer:** 18",
    "It's 12 o'clock; we'll go at 3:45 PM   (maybe)\r\n\tOK?",
    "cafe\u0301 na\u00efve \u00fcber \u65e5\u672c 🙂",  # NFD input: the NFC normaliser must act identically
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<tool_call>\n{}\n</tool_call><|im_end|>",
]


def corpus_words() -> set[str]:
    paragraphs, chats = load_corpus()
    text = " ".join(paragraphs) + " ".join(render_chat(c) for c in chats)
    return {w.lower() for w in re.findall(r"[A-Za-z]+", text)}


def test_tokenizer_ids_survive_save_and_reload_through_autotokenizer(tmp_path):
    paragraphs, chats = load_corpus()
    corpus = paragraphs + [render_chat(c) for c in chats[:80]]
    raw = train_bpe(corpus, vocab_size=1024)
    build_tokenizer(corpus, vocab_size=1024).save_pretrained(tmp_path)

    reloaded = AutoTokenizer.from_pretrained(tmp_path)

    # transformers 5 rebuilds any qwen2 tokenizer as Qwen2Tokenizer with Qwen's own normaliser and split
    # regex: the ids only survive if we trained with exactly those.
    assert isinstance(reloaded, Qwen2Tokenizer)
    for text in SAMPLES:
        assert reloaded.encode(text, add_special_tokens=False) == raw.encode(text).ids, text
        assert reloaded.decode(raw.encode(text).ids) == raw.decode(
            raw.encode(text).ids, skip_special_tokens=False
        )
    for token in ("<|endoftext|>", "<|im_start|>", "<|im_end|>", "<tool_call>", "</tool_call>", "<think>",
                  "</think>"):
        assert reloaded.encode(token, add_special_tokens=False) == [raw.token_to_id(token)]
    assert reloaded.eos_token == IM_END


def test_split_regex_is_exactly_the_one_qwen2tokenizer_installs():
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    assert QWEN_SPLIT_REGEX == PRETOKENIZE_REGEX


def test_committed_tokenizer_is_qwen2_with_a_useful_vocabulary(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())

    assert isinstance(tokenizer, Qwen2Tokenizer)
    assert config["model_type"] == "qwen2" and config["vocab_size"] == len(tokenizer)
    assert 6000 <= len(tokenizer) <= 10000
    # Common words are single tokens, so generated text is made of words, not bytes.
    assert len(tokenizer.encode(" the answer is", add_special_tokens=False)) == 3
    assert len(tokenizer.encode(" workspace tools session", add_special_tokens=False)) == 3
    assert (tiny_model_dir / "model.safetensors").stat().st_size < 8 * 1024 * 1024
    assert all(t.dtype == torch.float32 for t in load_file(tiny_model_dir / "model.safetensors").values())


def test_chat_template_renders_tools_tool_calls_and_tool_results(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    messages = [
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Oslo?"},
        {
            "role": "assistant",
            "content": None,
            # OpenAI's wire shape: arguments is a JSON string.
            "tool_calls": [
                {
                    "id": "c1",
                    "type": "function",
                    "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'},
                }
            ],
        },
        {"role": "tool", "tool_call_id": "c1", "content": '{"sky": "snowy"}'},
    ]

    text = tokenizer.apply_chat_template(
        messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True
    )

    assert text.startswith("<|im_start|>system\nBe brief.\n\n# Tools\n")
    assert "<tools>\n" + json.dumps(WEATHER_TOOL) + "\n</tools>" in text
    assert (
        '<|im_start|>assistant\n<tool_call>\n{"name": "get_weather", "arguments": {"city": "Oslo"}}\n'
        "</tool_call><|im_end|>\n"
    ) in text
    assert '<|im_start|>user\n<tool_response>\n{"sky": "snowy"}\n</tool_response><|im_end|>\n' in text
    assert text.endswith("<|im_start|>assistant\n")
    # Arguments given as a dict (what vLLM passes to the template) render the same.
    messages[2]["tool_calls"][0]["function"]["arguments"] = {"city": "Oslo"}
    assert (
        tokenizer.apply_chat_template(
            messages, tools=[WEATHER_TOOL], tokenize=False, add_generation_prompt=True
        )
        == text
    )
    # Without tools there is no tool preamble.
    plain = tokenizer.apply_chat_template(messages[:2], tokenize=False)
    assert "# Tools" not in plain and plain.startswith("<|im_start|>system\nBe brief.<|im_end|>\n")


def test_tiny_model_loads_and_writes_word_like_text(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template(
        [
            {
                "role": "user",
                "content": "Can you help me with my homework? A bus drives at 60 kilometers per hour "
                "for 3 hours. How far does it go?",
            }
        ],
        add_generation_prompt=True,
        return_tensors="pt",
        return_dict=True,
    )

    out = model.generate(**prompt, max_new_tokens=40, do_sample=False)
    text = tokenizer.decode(out[0, prompt["input_ids"].shape[1] :], skip_special_tokens=True)

    words = re.findall(r"[A-Za-z]+", text)
    known = corpus_words()
    assert len(words) >= 5, text
    assert sum(w.lower() in known for w in words) / len(words) >= 0.9, text


def test_lora_adapter_is_peft_shaped_non_zero_and_changes_logits(tiny_model_dir, lora_adapters):
    from peft import PeftModel

    adapter_dir = lora_adapters["a"]
    config = json.loads((adapter_dir / "adapter_config.json").read_text())
    weights = load_file(adapter_dir / "adapter_model.safetensors")

    assert config["peft_type"] == "LORA" and config["r"] == 8
    assert set(config["target_modules"]) == LORA_TARGET_MODULES
    lora_b = [t for name, t in weights.items() if "lora_B" in name]
    assert lora_b and all(t.abs().sum() > 0 for t in lora_b)

    ids = torch.tensor([AutoTokenizer.from_pretrained(tiny_model_dir).encode("The answer is")])
    base = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    with torch.no_grad():
        base_logits = base(ids).logits
        logits = {
            name: PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny_model_dir), path)(
                ids
            ).logits
            for name, path in lora_adapters.items()
        }
    assert (logits["a"] - base_logits).abs().max() > 0.5
    assert (logits["a"] - logits["b"]).abs().max() > 0.5


def test_build_tiny_model_command_writes_a_loadable_model(tmp_path):
    out = tmp_path / "tiny"
    call_command("build_tiny_model", "--out", str(out), "--steps", "2", "--seed", "3")

    info = json.loads((out / "build_info.json").read_text())
    model = AutoModelForCausalLM.from_pretrained(out)
    assert info["config"]["steps"] == 2 and info["config"]["seed"] == 3
    assert model.config.num_hidden_layers == 2 and model.config.hidden_size == 128
    assert model.config.max_position_embeddings == 32768
    assert set(info["hint_teacher"]) >= {"corpus/plain", "unseen/formatted"}
    assert isinstance(AutoTokenizer.from_pretrained(out), Qwen2Tokenizer)


def test_config_rejects_head_sizes_vllm_cpu_cannot_serve():
    with pytest.raises(ValueError, match="head size"):
        TinyModelConfig(hidden_size=64, num_attention_heads=4)


def test_corpus_has_both_answer_styles_and_tool_calls():
    _, chats = load_corpus()
    answers = [m["content"] or "" for c in chats for m in c["messages"] if m["role"] == "assistant"]
    assert any("**" in a for a in answers) and any(re.search(r"^1\. ", a, re.M) for a in answers)
    assert sum("**" not in a and "\n1. " not in a for a in answers) > len(answers) / 3
    assert any("tool_calls" in m for c in chats for m in c["messages"])
    assert (CORPUS_DIR / "prose.txt").exists()


def test_an_agent_shaped_first_request_fits_the_context_with_room_to_answer(tiny_model_dir):
    from workers.tiny_model.corpus.agent_chats import OPENCLAW_TOOL_NAMES, openclaw_shaped_request

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    config = json.loads((tiny_model_dir / "config.json").read_text())
    request = openclaw_shaped_request()

    ids = tokenizer.apply_chat_template(
        request["messages"], tools=request["tools"], add_generation_prompt=True, tokenize=True,
        return_dict=True,
    )["input_ids"]

    assert [t["function"]["name"] for t in request["tools"]] == OPENCLAW_TOOL_NAMES
    characters = sum(len(m["content"]) for m in request["messages"]) + sum(
        len(json.dumps(t)) for t in request["tools"])
    assert characters >= 52_000
    assert len(ids) <= 13_000, len(ids)
    assert config["max_position_embeddings"] == 32768 and tokenizer.model_max_length == 32768
    assert config["max_position_embeddings"] - len(ids) >= 8192  # an agent's default maxTokens still fits


def test_thinking_tags_are_single_tokens_and_the_template_renders_reasoning(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    think, end = tokenizer.convert_tokens_to_ids("<think>"), tokenizer.convert_tokens_to_ids("</think>")
    question = [{"role": "user", "content": "What is 4 times 9?"}]
    turn = {"role": "assistant", "content": "It is 36.", "reasoning_content": "4 times 9 is 36."}

    history = tokenizer.apply_chat_template(question + [turn], tokenize=False)
    thinking_prompt = tokenizer.apply_chat_template(
        question, tokenize=False, add_generation_prompt=True, enable_thinking=True)
    plain_prompt = tokenizer.apply_chat_template(question, tokenize=False, add_generation_prompt=True)
    off_prompt = tokenizer.apply_chat_template(
        question, tokenize=False, add_generation_prompt=True, enable_thinking=False)

    assert tokenizer.encode("<think>", add_special_tokens=False) == [think]
    assert tokenizer.encode("</think>", add_special_tokens=False) == [end]
    assert "<think>" not in tokenizer.all_special_tokens  # survives skip_special_tokens, like <tool_call>
    assert history.endswith(
        "<|im_start|>assistant\n<think>\n4 times 9 is 36.\n</think>\n\nIt is 36.<|im_end|>\n")
    assert thinking_prompt.endswith("<|im_start|>assistant\n<think>\n")
    assert plain_prompt == off_prompt and plain_prompt.endswith("<|im_start|>assistant\n")
    assert "<think>" not in plain_prompt
    # What the model generates after the thinking prompt, appended, is the history rendering of that turn.
    assert history.startswith(thinking_prompt)
    # Without reasoning_content an assistant message renders as before (no empty think block).
    assert "<think>" not in tokenizer.apply_chat_template(question + [{"role": "assistant", "content": "36"}],
                                                          tokenize=False)
    # Reasoning before a tool call: the call follows the think block on its own line.
    call = {"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": '{"city": "Oslo"}'}}
    with_call = tokenizer.apply_chat_template(
        [*question,
         {"role": "assistant", "content": None, "tool_calls": [call], "reasoning_content": "Look."}],
        tools=[WEATHER_TOOL], tokenize=False)
    assert "<|im_start|>assistant\n<think>\nLook.\n</think>\n\n<tool_call>\n" in with_call


def test_an_ordinary_reply_never_opens_a_think_block(tiny_model_dir):
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir)
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "A garden is 6 meters long and 4 meters wide. What is its area?"}],
        add_generation_prompt=True, return_tensors="pt", return_dict=True)

    with torch.no_grad():
        first = torch.softmax(model(**prompt).logits[0, -1], dim=-1)

    # <think> is never a training target (the template writes it), so sampling one by itself is rare.
    assert first[tokenizer.convert_tokens_to_ids("<think>")] < 0.01


def test_hint_teacher_check_scores_a_reply_the_way_the_model_does(tiny_model_dir):
    from workers.tiny_model.teacher_check import reply_logprobs

    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    pairs = [("What is 2 plus 3?", "2 plus 3 is 5."), ("Hi", "Hello! How can I help you today?")]

    batched = reply_logprobs(model, tokenizer, pairs)

    for (user, reply), score in zip(pairs, batched, strict=True):
        prompt = tokenizer.apply_chat_template(
            [{"role": "user", "content": user}], add_generation_prompt=True, tokenize=True, return_dict=True
        )["input_ids"]
        answer = tokenizer.encode(reply + IM_END, add_special_tokens=False)
        with torch.no_grad():
            logits = model(input_ids=torch.tensor([prompt + answer])).logits[0]
        logprobs = torch.log_softmax(logits, dim=-1)[len(prompt) - 1: -1]
        expected = logprobs.gather(1, torch.tensor(answer)[:, None]).mean().item()
        assert abs(score - expected) < 1e-4


def test_corpus_has_hinted_chats_in_both_directions_thinking_and_long_agent_chats():
    from workers.tiny_model.builder import load_long_chats

    _, chats = load_corpus()
    hinted = [c for c in chats if HINT_BLOCK in (c["messages"][-2].get("content") or "")]
    replies = [c["messages"][-1]["content"] for c in hinted]
    assert len(hinted) > 100
    assert any("**" in r for r in replies) and any("**" not in r and "\n1. " not in r for r in replies)
    assert sum("reasoning_content" in m for c in chats for m in c["messages"]) >= 30
    long = load_long_chats()
    assert len(long) >= 20 and all(c["messages"][0]["role"] == "system" and c["tools"] for c in long)
    first_user = [m for m in long[0]["messages"] if m["role"] == "user"][0]["content"]
    assert re.match(r"\[\w{3} \d{4}-\d\d-\d\d \d\d:\d\d UTC\] ", first_user)
    assert "\nRuntime: agent=main | session=agent:main:main | sessionId=" in first_user


def test_contrastive_hinted_chats_come_after_the_mix_and_differ_only_in_the_hint():
    from workers.tiny_model.corpus.make_chats import CONTRASTIVE_QUESTIONS, MIXED_CHATS

    _, chats = load_corpus()
    assert len(chats) == MIXED_CHATS + 3 * CONTRASTIVE_QUESTIONS
    contrastive = chats[MIXED_CHATS:]
    assert not any(HINT_BLOCK in (m.get("content") or "") for c in contrastive for m in c["messages"][:-2])
    for triple in zip(contrastive[0::3], contrastive[1::3], contrastive[2::3], strict=True):
        asked = {c["messages"][-2]["content"].split(HINT_BLOCK)[0] for c in triple}
        assert len(asked) == 1 and len({json.dumps(c["messages"][:-2]) for c in triple}) == 1
        assert all(HINT_BLOCK in c["messages"][-2]["content"] for c in triple)
        replies = [c["messages"][-1]["content"] for c in triple]
        assert "**" not in replies[0] and "\n1. " not in replies[0]
        assert replies[1].startswith("Great question") and "**" not in replies[1]
        assert replies[2].startswith("**Solution**") and "\n1. " in replies[2]


def test_the_tokenizer_reads_a_committed_snapshot_not_the_checkout(tmp_path):
    from workers.tiny_model.builder import (
        TOKENIZER_TEXT_SNAPSHOT,
        snapshot_tokenizer_texts,
        tokenizer_texts,
        tree_texts,
    )

    texts = tokenizer_texts()
    assert TOKENIZER_TEXT_SNAPSHOT.exists() and len(texts) > 100 and sum(map(len, texts)) > 1_000_000
    # The same tree gives the same bytes (no timestamp), and a snapshot reads back as the tree's texts.
    (tmp_path / "README.md").write_text("ClawHub trains adapters.")
    (tmp_path / "clawhub").mkdir()
    (tmp_path / "clawhub" / "notes.md").write_text("Sessions and turns.")
    first, second = tmp_path / "a.json.gz", tmp_path / "b.json.gz"
    snapshot_tokenizer_texts(tmp_path, first)
    snapshot_tokenizer_texts(tmp_path, second)
    assert first.read_bytes() == second.read_bytes()
    expected = ["ClawHub trains adapters.", "Sessions and turns."]
    assert tokenizer_texts(first) == tree_texts(tmp_path) == expected


def test_the_committed_model_reads_the_corpus_hints(tiny_model_dir):
    """OPD's teacher is the base model with the hint: on questions the corpus never asks, the hint must make
    the compliant reply the likelier one for each style (plain, friendly-and-specific, formatted) with the
    corpus's phrasings, which include the benchmark's judge-rule hints."""
    from workers.tiny_model.teacher_check import hint_teacher_check

    model = AutoModelForCausalLM.from_pretrained(tiny_model_dir).eval()
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    _, chats = load_corpus()
    check = hint_teacher_check(model, tokenizer, "\n".join(render_chat(c) for c in chats))
    for style in ("plain", "friendly", "formatted"):
        figures = check[f"corpus/{style}"]
        assert figures["preference_with_hint"] > 0.8, (style, figures)
        assert figures["preference_with_hint"] > figures["preference_without_hint"] + 0.3, (style, figures)
