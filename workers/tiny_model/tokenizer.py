"""The tiny model's tokenizer and chat template: a byte-level BPE with exactly Qwen2's splitting, special
and tag tokens like Qwen2.5's and Qwen3's, and Qwen2.5-Instruct's template with the changes noted at
CHAT_TEMPLATE."""

from __future__ import annotations

import json
from typing import Any

from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from transformers import Qwen2Tokenizer

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
# Like Qwen3: the reasoning tags are single non-special tokens too (reasoning parsers find them by id, and a
# trainer rebuilding a thinking turn must get the ids vLLM served).
THINK_START, THINK_END = "<think>", "</think>"
THINK_TAGS = [THINK_START, THINK_END]

# Qwen2.5-Instruct's template, with three changes: tool-call arguments given as a JSON string (OpenAI's wire
# shape) are written as-is instead of being JSON-encoded a second time; an assistant message's
# reasoning_content is written as "<think>\n{reasoning}\n</think>\n\n" before its content (every such
# message, so a thinking turn renders the same in later prompts as it was generated); and
# chat_template_kwargs={"enable_thinking": true} opens a <think> block in the generation prompt. Without
# that flag no think block is written, as in Qwen2.5.
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
    {%- if message.role == "user" or (message.role == "system" and not loop.first) %}
        {{- '<|im_start|>' + message.role + '\\n' + (message.content or '') + '<|im_end|>' + '\\n' }}
    {%- elif message.role == "assistant" %}
        {%- set content = message.content or '' %}
        {%- if message.reasoning_content is string and message.reasoning_content %}
            {#- Without content (a tool call follows) one newline less: the call's own leading newline. #}
            {%- set content = '<think>\\n' + message.reasoning_content + '\\n</think>\\n'
                + ('\\n' + content if content else '') %}
        {%- endif %}
        {%- if not message.tool_calls %}
            {{- '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}
        {%- else %}
        {{- '<|im_start|>' + message.role }}
        {%- if content %}
            {{- '\\n' + content }}
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
        {%- endif %}
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
    {%- if enable_thinking is defined and enable_thinking %}
        {{- '<think>\\n' }}
    {%- endif %}
{%- endif %}
"""


def render_chat(chat: dict[str, Any], **template_kwargs: Any) -> str:
    """A chat as the model sees it, through the same Jinja template vLLM and transformers use."""
    from transformers.utils.chat_template_utils import render_jinja_template

    rendered, _ = render_jinja_template(
        conversations=[chat["messages"]], tools=chat.get("tools"), chat_template=CHAT_TEMPLATE,
        **template_kwargs,
    )
    return rendered[0]


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
        special_tokens=SPECIAL_TOKENS + TOOL_TAGS + THINK_TAGS,
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
        model_max_length=32768,
        extra_special_tokens=[IM_START, IM_END],
    )
    tokenizer.add_tokens(TOOL_TAGS + THINK_TAGS)
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer
