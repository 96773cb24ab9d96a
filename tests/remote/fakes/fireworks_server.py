"""A local Fireworks that the real fireworks-ai SDKs talk to: the serverless trainer and the model registry.

Training (fireworks.training.sdk.FiretitanServiceClient): Fireworks' fork of the tinker SDK, against
{base}/training/v1/serverless/api/v1/... with the same futures and X-API-Key; it differs from Tinker in that
forward_backward is sent as JSON and sessions are "ts-<hex>". So this fake is the Tinker fake under that
prefix.
Control plane (Authorization: Bearer): POST /v1/accounts/{a}/trainingSessions/{s}/checkpoints/{c}:promote
registers the sampler checkpoint as a model, GET /v1/accounts/{a}/models/{m}:getDownloadEndpoint returns
a signed
URL per file (camelCase `filenameToSignedUrls`, as the REST API does).
"""

from __future__ import annotations

import json
import secrets
from pathlib import Path

from tests.remote.fakes.base import Request, Response
from tests.remote.fakes.tinker_server import FakeTinker

SERVERLESS = "/training/v1/serverless"


class FakeFireworks(FakeTinker):
    def __init__(self, *, base_model_dir: Path, api_key: str, account_id: str, artifacts_dir: Path) -> None:
        super().__init__(base_model_dir=base_model_dir, api_key=api_key, artifacts_dir=artifacts_dir)
        self.account_id = account_id
        self.promoted: dict[str, dict] = {}  # model id -> {"checkpoint", "dir", "base_model"}
        acct = r"/v1/accounts/(?P<account>[^/]+)"
        self.route(
            "POST",
            acct + r"/trainingSessions/(?P<session>[^/]+)/checkpoints/(?P<ckpt>[^/:]+):promote",
            self._promote,
        )
        self.route("GET", acct + r"/models/(?P<model>[^/:]+):getDownloadEndpoint", self._download_endpoint)
        # Serverless sampling (FiretitanSamplingClient -> DeploymentSampler): the OpenAI-style completions API
        # under the serverless prefix, token ids in, SSE out.
        self.route("POST", r"/inference/v1/completions", self._completions)
        self.completion_requests: list[dict] = []  # {"model", "prompt", "echo", "top_logprobs", ...}

    def dispatch(self, method, raw_path, headers, body):
        # The trainer's routes are Tinker's under the serverless prefix.
        if raw_path.startswith(SERVERLESS):
            raw_path = raw_path[len(SERVERLESS) :]
        return super().dispatch(method, raw_path, headers, body)

    def authorize(self, request: Request) -> Response | None:
        if request.path.startswith("/signed/"):
            return None
        if request.path.startswith("/v1/"):
            # The Stainless client sends a bearer token, the training SDK's control-plane helpers X-Api-Key.
            if (
                f"Bearer {self.api_key}" != request.header("authorization")
                and request.header("x-api-key") != self.api_key
            ):
                return Response(401, {"error": {"code": 16, "message": "unauthenticated: invalid API key"}})
            if not request.path.startswith(f"/v1/accounts/{self.account_id}/"):
                return Response(403, {"error": {"code": 7, "message": "permission denied for account"}})
            return None
        if request.path.startswith("/inference/"):
            # The sampler authenticates like Fireworks' inference API: a bearer token.
            if request.header("authorization") != f"Bearer {self.api_key}":
                return Response(
                    401,
                    {
                        "error": {
                            "object": "error",
                            "type": "invalid_request_error",
                            "message": "The API key you provided is invalid.",
                        }
                    },
                )
            return None
        return super().authorize(request)

    def checkpoint_path(self, model_id: str, kind: str, name: str) -> str:
        # Fireworks' trainers name checkpoints logically (no tinker:// URI); the SDK refuses URIs on restore.
        return name if kind == "weights" else f"{model_id}/{kind}/{name}"

    def _new_id(self, prefix: str) -> str:
        if prefix == "session":
            return f"ts-{secrets.token_hex(8)}"  # what the serverless gateway mints
        return super()._new_id(prefix)

    def _promote(self, request: Request) -> Response:
        ckpt = request.params["ckpt"]
        session = request.params["session"]
        model = next(
            (
                m
                for m in self.models.values()
                if m.model_id.startswith(session)
                and any(p.endswith(f"/sampler_weights/{ckpt}") for p in m.saved)
            ),
            None,
        )
        if model is None:
            return Response(
                404, {"error": {"code": 5, "message": f"checkpoint {ckpt} not found in {session}"}}
            )
        model_id = request.json["output_model"].rsplit("/", 1)[-1]
        out = self.artifacts_dir / "models" / model_id
        self.export_lora(model, out)
        self.promoted[model_id] = {"checkpoint": ckpt, "dir": out, "base_model": request.json["base_model"]}
        return Response(
            body={
                "name": request.json["output_model"],
                "state": "READY",
                "kind": "HF_PEFT_ADDON",
                "baseModelDetails": {},
                "peftDetails": {"baseModel": request.json["base_model"], "r": model.rank},
            }
        )

    def _download_endpoint(self, request: Request) -> Response:
        promoted = self.promoted.get(request.params["model"])
        if promoted is None:
            return Response(404, {"error": {"code": 5, "message": "model not found"}})
        urls = {}
        for file in sorted(promoted["dir"].iterdir()):
            token = secrets.token_urlsafe(12)
            self.files[token] = file
            urls[file.name] = f"{self.url}/signed/{token}/{file.name}"
        return Response(body={"filenameToSignedUrls": urls})

    # ------------------------------------------------------------------ inference (teacher log-probs)

    def _completions(self, request: Request) -> Response:
        """POST /inference/v1/completions as the training SDK's DeploymentSampler sends it: `prompt` is a list
        of token ids, `stream` true, `echo` + `logprobs` for prompt log-probs (compute_logprobs), `raw_output`
        for token ids back, optionally `top_logprobs` k. Answers the SSE stream Fireworks sends: choices[0]
        with the echoed prompt + 1 greedy token in raw_output.completion_token_ids and one logprobs.content
        row per returned token (the first, unconditional one is 0.0), then a usage chunk and [DONE]."""
        body = request.json
        prompt = [int(t) for t in body["prompt"]]
        model = body["model"]
        if not model.startswith(f"accounts/{self.account_id}/trainingSessions/"):
            return Response(404, {"error": {"object": "error", "message": f"model {model} not found"}})
        k = int(body.get("top_logprobs") or 0)
        self.completion_requests.append(
            {
                "model": model,
                "prompt": prompt,
                "echo": bool(body.get("echo")),
                "top_logprobs": k,
                "logprobs": body.get("logprobs"),
                "raw_output": body.get("raw_output"),
                "max_tokens": body.get("max_tokens"),
            }
        )
        if body.get("max_tokens") != 1 or not body.get("logprobs") or not body.get("raw_output"):
            return Response(400, {"error": {"object": "error", "message": "the fake only scores prompts"}})
        ids, top = self.logprobs.topk(prompt + [0], max(k, 1))
        generated = int(ids[-1][0])  # greedy next token: the fake never samples
        tokens = prompt + [generated]
        logprobs = self.logprobs.token_logprobs(tokens)
        logprobs[0] = 0.0  # the first token has no context; the SDK drops this row
        rows = []
        for i, (token, lp) in enumerate(zip(tokens, logprobs, strict=True)):
            row = {"token": f"<{token}>", "token_id": token, "logprob": lp, "sampling_logprob": lp}
            if k:  # row i of topk(prompt + [x]) is the distribution of token i: the generated one's too
                row["top_logprobs"] = [
                    {"token_id": int(t), "logprob": float(v)} for t, v in zip(ids[i], top[i], strict=True)
                ]
            rows.append(row)
        if not body.get("echo"):
            rows = rows[len(prompt) :]
        returned = tokens if body.get("echo") else [generated]
        chunk_id = self._new_id("cmpl")
        events = [
            {
                "id": chunk_id,
                "object": "text_completion",
                "model": model,
                "choices": [
                    {
                        "index": 0,
                        "text": f"<{generated}>",
                        "logprobs": {"content": rows},
                        "finish_reason": "length",
                        "raw_output": {"prompt_token_ids": prompt, "completion_token_ids": returned},
                    }
                ],
            },
            {
                "id": chunk_id,
                "object": "text_completion",
                "model": model,
                "choices": [],
                "usage": {
                    "prompt_tokens": len(prompt),
                    "completion_tokens": 1,
                    "total_tokens": len(prompt) + 1,
                },
                "perf_metrics": {"prompt-tokens": str(len(prompt))},
            },
        ]
        stream = "".join(f"data: {json.dumps(e)}\n\n" for e in events) + "data: [DONE]\n\n"
        return Response(body=stream.encode(), content_type="text/event-stream")
