import json
import os
import subprocess
import tempfile
import time
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from workers import base_models, vllm_cpu


class Command(BaseCommand):
    help = (
        "Build the tiny Qwen2 model (tokenizer trained on workers/tiny_model/corpus, short CPU pre-training) "
        "that tests, CI and the embedded default serve through vLLM. The result is committed under models/. "
        "With --measure, build nothing: serve the model at --out with vllm-cpu and time an agent-shaped "
        "first request (~52,800 characters, 12 tools)."
    )

    def add_arguments(self, parser):
        parser.add_argument("--out", default=str(Path(settings.BASE_DIR) / "models" / "tiny-qwen2"))
        parser.add_argument("--steps", type=int, default=None, help="default: TinyModelConfig.steps")
        parser.add_argument("--seed", type=int, default=0)
        parser.add_argument("--measure", action="store_true",
                            help="measure prefill, decode and memory in vllm-cpu instead of building")
        parser.add_argument("--port", type=int, default=8791, help="with --measure: vLLM's port")

    def handle(self, *args, out, steps, seed, measure, port, **options):
        if measure:
            self.stdout.write(json.dumps(measure_long_prompt(model_dir=Path(out), port=port), indent=2))
            return
        # Imported here, not at module level: Django imports every command module to list them, and the web
        # process must never import torch.
        from workers.tiny_model.builder import TinyModelConfig, build_tiny_model

        cfg = TinyModelConfig(seed=seed) if steps is None else TinyModelConfig(steps=steps, seed=seed)
        summary = build_tiny_model(out, cfg, log=lambda line: self.stdout.write(line))
        self.stdout.write(json.dumps({k: v for k, v in summary.items() if k != "config"}))
        self.stdout.write(self.style.SUCCESS(f"tiny model written to {out}"))


def _peak_rss_mib(pid: int) -> float:
    """VmHWM (peak resident set) of a process and its children, from /proc, in MiB."""
    total = 0
    for task in [pid, *_children(pid)]:
        try:
            status = Path(f"/proc/{task}/status").read_text()
        except OSError:
            continue
        total += next((int(line.split()[1]) for line in status.splitlines() if line.startswith("VmHWM")), 0)
    return round(total / 1024, 1)


def _children(pid: int) -> list[int]:
    found = []
    for path in Path(f"/proc/{pid}/task").glob("*/children"):
        for child in path.read_text().split():
            found += [int(child), *_children(int(child))]
    return found


def measure_long_prompt(*, model_dir: Path, port: int, replies: int = 3) -> dict:
    """Start vllm-cpu on `model_dir` (the command line `serve` uses, from the model's description), send the
    agent-shaped request as an agent client does (streamed, tools, tool_choice auto, usage), and report prompt
    tokens, seconds to the first token (prefill), decode tokens/s, how the replies ended and the server's peak
    RSS. ``manage.py prepare_model --measure`` runs it on the default model."""
    import httpx

    from workers.tiny_model.corpus.agent_chats import openclaw_shaped_request

    root = Path(settings.BASE_DIR)
    spec = base_models.describe(model_dir)
    argv = vllm_cpu.serve_argv(root=root, model=str(model_dir), port=port)
    env = {**os.environ, **vllm_cpu.env_defaults(str(model_dir)), **vllm_cpu.OFFLINE_ENV}
    base = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        proc = subprocess.Popen(argv, env=env, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            started = time.monotonic()
            while True:
                if proc.poll() is not None:
                    log.seek(0)
                    raise CommandError("vLLM exited:\n" + log.read().decode(errors="replace")[-3000:])
                try:
                    if httpx.get(f"{base}/health", timeout=2).status_code == 200:
                        break
                except httpx.HTTPError:
                    pass
                if time.monotonic() - started > 600:
                    raise CommandError("vLLM did not start within 600 s")
                time.sleep(1)
            idle_rss = _peak_rss_mib(proc.pid)
            request = openclaw_shaped_request()
            runs = []
            for _ in range(replies):
                try:
                    runs.append(_stream_once(base, request, model=spec.served_name,
                                             temperature=spec.temperature or 1.0))
                except httpx.HTTPError as exc:
                    log.seek(0)
                    tail = log.read().decode(errors="replace")[-4000:]
                    raise CommandError(f"{exc}; vLLM log tail:\n{tail}") from exc
            return {
                "characters": sum(len(m["content"]) for m in request["messages"])
                + sum(len(json.dumps(t)) for t in request["tools"]),
                "prompt_tokens": runs[0]["prompt_tokens"],
                "prefill_seconds": [r["first_token_s"] for r in runs],
                "decode_tokens_per_s": [r["decode_tokens_per_s"] for r in runs],
                "completion_tokens": [r["completion_tokens"] for r in runs],
                "finish_reasons": [r["finish_reason"] for r in runs],
                "replies": [r["text"][:200] for r in runs],
                "peak_rss_mib_before_request": idle_rss,
                "peak_rss_mib": _peak_rss_mib(proc.pid),
            }
        finally:
            os.killpg(proc.pid, 15)
            proc.wait(timeout=60)


def _stream_once(base: str, request: dict, *, model: str, temperature: float) -> dict:
    import httpx

    body = {"model": model, "messages": request["messages"], "tools": request["tools"],
            "tool_choice": "auto", "stream": True, "stream_options": {"include_usage": True},
            "max_completion_tokens": 128, "temperature": temperature}
    # No "seed": vllm-cpu 0.32 kills its engine on a seeded request whose prompt is prefilled in chunks
    # ("CPU Generator does not use offset"), which a prompt this long is.
    sent = time.monotonic()
    first = None
    text, usage, finish = [], {}, None
    with httpx.stream("POST", f"{base}/v1/chat/completions", json=body, timeout=600) as resp:
        resp.raise_for_status()
        for line in resp.iter_lines():
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            chunk = json.loads(line[6:])
            for choice in chunk.get("choices") or []:
                delta = choice.get("delta") or {}
                piece = (delta.get("content") or "") + "".join(
                    (c.get("function") or {}).get("arguments") or "" for c in delta.get("tool_calls") or [])
                if piece and first is None:
                    first = time.monotonic()
                text.append(piece)
                finish = choice.get("finish_reason") or finish
            usage = chunk.get("usage") or usage
    done = time.monotonic()
    first = first or done
    completion = usage.get("completion_tokens", 0)
    return {"prompt_tokens": usage.get("prompt_tokens"), "completion_tokens": completion,
            "first_token_s": round(first - sent, 2), "finish_reason": finish, "text": "".join(text),
            "decode_tokens_per_s": round((completion - 1) / (done - first), 1) if done > first else None}
