"""A local Tinker service that the real `tinker` SDK talks to unchanged.

Wire protocol (tinker 0.38, read from the SDK's sources): every call is HTTP POST {base}/api/v1/<op> with
a JSON
body, except forward_backward whose body is a protobuf `ForwardBackwardRequest`. Operations that do work
answer
{"request_id"} and the SDK polls POST /api/v1/retrieve_future until it gets the result: JSON for most types,
protobuf (`Accept: application/x-protobuf`) for ForwardBackwardOutput and SampleResponse. A poll may answer
{"type": "try_again"} or HTTP 408 (queue not ready); the fake does both once per future so the SDK's polling
path is exercised. Authentication is the X-API-Key header.

The "model" behind the fake is the committed tiny Qwen2: teacher log-probs (compute_logprobs through a
sampling
client) and the per-datum log-probs of forward_backward are real prefill log-probs of that model, and exported
weights are a real, non-zero PEFT LoRA for it (workers.tiny_model.builder.make_lora_adapter), so they
load into
peft and vLLM. Nothing is trained: the fake records what the SDK sent (`forward_backward_batches`,
`optim_steps`) so tests can compare it with the batch.
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import secrets
import threading
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np
from tinker.proto import tinker_public_pb2 as pb

from tests.remote.fakes.base import FakeServer, Request, Response

PROTO = "application/x-protobuf"
_DTYPES = {pb.DTYPE_FLOAT32: np.float32, pb.DTYPE_INT64: np.int64, pb.DTYPE_INT32: np.int32}


@dataclass
class RecordedDatum:
    """One datum as the SDK put it on the wire."""

    input_tokens: list[int]
    loss_fn_inputs: dict[str, list[float]]


@dataclass
class RecordedForwardBackward:
    model_id: str
    loss_fn: str
    loss_fn_config: dict[str, float]
    data: list[RecordedDatum]
    loss: float = 0.0  # the summed clipped surrogate the fake reported back as metrics["loss:sum"]


@dataclass
class _Model:
    model_id: str
    base_model: str
    rank: int
    steps: int = 0
    saved: dict[str, int] = field(default_factory=dict)  # checkpoint path -> step it holds


class TinyLogprobs:
    """Prefill log-probs of the tiny base model (the fake's 'model'); loaded once per process."""

    _lock = threading.Lock()
    _cache: dict[str, Any] = {}

    def __init__(self, model_dir: Path) -> None:
        self.model_dir = Path(model_dir)

    def _model(self):
        with self._lock:
            key = str(self.model_dir)
            if key not in self._cache:
                import torch
                from transformers import AutoModelForCausalLM

                model = AutoModelForCausalLM.from_pretrained(self.model_dir, dtype=torch.float32)
                model.eval()
                self._cache[key] = model
            return self._cache[key]

    def token_logprobs(self, tokens: list[int]) -> list[float]:
        """log p(tokens[i] | tokens[:i]) for i >= 1; NaN at 0 (no context), like Tinker's prompt logprobs."""
        import torch

        if len(tokens) < 2:
            return [math.nan] * len(tokens)
        with torch.no_grad():
            logits = self._model()(input_ids=torch.tensor([tokens])).logits[0].float()
        logp = torch.log_softmax(logits[:-1], dim=-1).gather(1, torch.tensor(tokens[1:])[:, None])[:, 0]
        return [math.nan, *logp.tolist()]

    def topk(self, tokens: list[int], k: int) -> tuple[np.ndarray, np.ndarray]:
        """(len(tokens), k) top-k ids and log-probs of the next-token distribution before each token."""
        import torch

        with torch.no_grad():
            logits = self._model()(input_ids=torch.tensor([tokens])).logits[0].float()
        top = torch.log_softmax(logits[:-1], dim=-1).topk(k, dim=-1)
        ids = np.zeros((len(tokens), k), dtype=np.int32)
        logprobs = np.zeros((len(tokens), k), dtype=np.float32)
        ids[1:], logprobs[1:] = top.indices.numpy(), top.values.numpy()
        return ids, logprobs


class FakeTinker(FakeServer):
    def __init__(self, *, base_model_dir: Path, api_key: str, artifacts_dir: Path) -> None:
        super().__init__()
        self.api_key = api_key
        self.base_model_dir = Path(base_model_dir)
        self.artifacts_dir = Path(artifacts_dir)
        self.logprobs = TinyLogprobs(self.base_model_dir)
        self.try_again_polls = 1  # polls answered "try_again" (then one 408) before each result
        self._ids = itertools.count(1)
        self._lock = threading.Lock()
        self._futures: dict[str, dict[str, Any]] = {}
        self.models: dict[str, _Model] = {}
        self.sessions: dict[str, dict[str, Any]] = {}
        self.samplers: dict[str, dict[str, Any]] = {}
        self.files: dict[str, Path] = {}  # signed-URL token -> file
        # What the SDK sent, for the tests.
        self.forward_backward_batches: list[RecordedForwardBackward] = []
        self.optim_steps: list[dict[str, Any]] = []
        self.loads: list[dict[str, Any]] = []
        self.logprob_requests: list[list[int]] = []
        self.topk_requests: list[tuple[list[int], int]] = []

        api = r"/api/v1"
        self.route("POST", api + r"/client/config", self._client_config)
        self.route("POST", api + r"/client/dynamic_config", lambda r: Response(body={}))
        self.route("POST", api + r"/telemetry", lambda r: Response(body={"status": "accepted"}))
        self.route("POST", api + r"/healthz", lambda r: Response(body={"status": "ok"}))
        self.route("POST", api + r"/create_session", self._create_session)
        self.route(
            "POST", api + r"/session_heartbeat", lambda r: Response(body={"type": "session_heartbeat"})
        )
        self.route("POST", api + r"/sessions/(?P<session_id>[^/]+)/finish", self._finish_session)
        self.route("POST", api + r"/create_model", self._create_model)
        self.route("POST", api + r"/get_info", self._get_info)
        self.route("POST", api + r"/forward_backward", self._forward_backward)
        self.route("POST", api + r"/optim_step", self._optim_step)
        self.route("POST", api + r"/save_weights", self._save_weights)
        self.route("POST", api + r"/load_weights", self._load_weights)
        self.route("POST", api + r"/weights_info", self._weights_info)
        self.route("POST", api + r"/save_weights_for_sampler", self._save_weights_for_sampler)
        self.route("POST", api + r"/save_weights_external", self._save_weights_external)
        self.route(
            "GET",
            api + r"/training_runs/(?P<run>[^/]+)/checkpoints/(?P<ckpt>.+)/external_weights_urls",
            self._external_weights_urls,
        )
        self.route("POST", api + r"/create_sampling_session", self._create_sampling_session)
        self.route("GET", api + r"/samplers/(?P<sampler_id>[^/]+)", self._get_sampler)
        self.route("POST", api + r"/asample", self._asample)
        self.route("POST", api + r"/retrieve_future", self._retrieve_future)
        self.route("GET", r"/signed/(?P<token>[^/]+)/(?P<name>.+)", self._download)

    # ------------------------------------------------------------------ plumbing

    def authorize(self, request: Request) -> Response | None:
        if request.path.startswith("/signed/"):
            return None  # signed URLs carry their own token, like a cloud bucket's
        if request.header("x-api-key") != self.api_key:
            return Response(401, {"detail": "Invalid API key"})
        return None

    def _new_id(self, prefix: str) -> str:
        return f"{prefix}-{next(self._ids)}-{secrets.token_hex(3)}"

    def _future(self, result: Any, content_type: str = "application/json", **extra: Any) -> Response:
        request_id = self._new_id("req")
        with self._lock:
            self._futures[request_id] = {"result": result, "type": content_type, "polls": 0}
        return Response(body={"request_id": request_id, **extra})

    def _retrieve_future(self, request: Request) -> Response:
        request_id = request.json["request_id"]
        with self._lock:
            future = self._futures.get(request_id)
            if future is None:
                return Response(404, {"detail": f"unknown request {request_id}"})
            future["polls"] += 1
            polls = future["polls"]
        if polls <= self.try_again_polls:
            return Response(body={"type": "try_again", "request_id": request_id, "queue_state": "active"})
        if polls == self.try_again_polls + 1 and self.try_again_polls:
            return Response(408, {"type": "try_again", "queue_state": "active"})
        result = future["result"]
        if future["type"] == PROTO:
            return Response(body=result, content_type=PROTO)
        return Response(body=result)

    # ------------------------------------------------------------------ sessions and models

    def _client_config(self, request: Request) -> Response:
        # use_pyqwest_transport=False is a server-side switch the SDK honours: its Rust transport's
        # threads can
        # abort a test process at interpreter exit ("PyGILState_Release ... must be current"); httpx cannot.
        return Response(
            body={"pjwt_auth_enabled": False, "proto_compress_fwdbwd": False, "use_pyqwest_transport": False}
        )

    def _create_session(self, request: Request) -> Response:
        session_id = self._new_id("session")
        self.sessions[session_id] = {"tags": request.json.get("tags"), "finished": False}
        return Response(body={"type": "create_session", "session_id": session_id})

    def _finish_session(self, request: Request) -> Response:
        session = self.sessions.get(request.params["session_id"])
        if session is not None:
            session["finished"] = True
            session["reason"] = ((request.json or {}).get("reason") or {}).get("type")
        return Response(body={})

    def _create_model(self, request: Request) -> Response:
        body = request.json
        # The SDK derives ids of runs created from a checkpoint as "<session>:train:<seq>"; use it throughout.
        model_id = f"{body['session_id']}:train:{body['model_seq_id']}"
        rank = (body.get("lora_config") or {}).get("rank", 32)
        self.models[model_id] = _Model(model_id=model_id, base_model=body["base_model"], rank=rank)
        return self._future({"type": "create_model", "model_id": model_id})

    def _get_info(self, request: Request) -> Response:
        model = self.models[request.json["model_id"]]
        return Response(
            body={
                "type": "get_info",
                "model_id": model.model_id,
                "model_data": {"arch": "qwen2", "model_name": model.base_model, "tokenizer_id": None},
                "is_lora": True,
                "lora_rank": model.rank,
                "model_name": model.base_model,
            }
        )

    # ------------------------------------------------------------------ training

    def _forward_backward(self, request: Request) -> Response:
        if request.json is not None:  # Fireworks' fork of the SDK sends this request as JSON
            return self._record_forward_backward(*self._parse_json_forward_backward(request.json))
        msg = pb.ForwardBackwardRequest()
        msg.ParseFromString(request.body)
        data = []
        for datum in msg.data:
            tokens: list[int] = []
            for chunk in datum.model_input:
                tokens += np.frombuffer(chunk.encoded_text.tokens, dtype=np.int32).tolist()
            inputs = {
                name: np.frombuffer(t.dense, dtype=_DTYPES[t.dtype]).tolist()
                for name, t in datum.loss_fn_inputs.items()
            }
            data.append(RecordedDatum(input_tokens=tokens, loss_fn_inputs=inputs))
        config = {k: v for k, v in msg.loss_fn_config.items()}
        return self._record_forward_backward(msg.model_id, msg.loss_fn, config, data)

    @staticmethod
    def _parse_json_forward_backward(body: dict) -> tuple[str, str, dict[str, float], list[RecordedDatum]]:
        fb = body["forward_backward_input"]
        data = [
            RecordedDatum(
                input_tokens=[t for chunk in d["model_input"]["chunks"] for t in chunk["tokens"]],
                loss_fn_inputs={name: list(t["data"]) for name, t in d["loss_fn_inputs"].items()},
            )
            for d in fb["data"]
        ]
        return body["model_id"], fb["loss_fn"], dict(fb.get("loss_fn_config") or {}), data

    def _record_forward_backward(
        self, model_id: str, loss_fn: str, config: dict[str, float], data: list[RecordedDatum]
    ) -> Response:
        record = RecordedForwardBackward(model_id=model_id, loss_fn=loss_fn, loss_fn_config=config, data=data)
        output = self._forward_backward_output(loss_fn, config, data)
        record.loss = pb.ForwardBackwardOutput.FromString(output).metrics["loss:sum"]
        self.forward_backward_batches.append(record)
        return self._future(output, PROTO)

    def _forward_backward_output(self, loss_fn: str, config: dict[str, float], data: list[RecordedDatum]):
        """Per-datum log-probs of the target tokens under the (never-updated) tiny model, and the PPO loss."""
        low = 1 - config.get("clip_low_threshold", 0.8) if "clip_low_threshold" in config else 0.2
        high = config.get("clip_high_threshold", 1.28) - 1 if "clip_high_threshold" in config else 0.28
        out = pb.ForwardBackwardOutput(loss_fn_output_type="ArrayRecord")
        record = out.loss_fn_outputs.add(num_datums=len(data))
        field_ = record.fields["logprobs"]
        field_.dtype = pb.DTYPE_FLOAT32
        chunks, offsets, loss = [], [0], 0.0
        for datum in data:
            targets = [int(t) for t in datum.loss_fn_inputs["target_tokens"]]
            full = datum.input_tokens + targets[-1:]
            logp = np.array(self.logprobs.token_logprobs(full)[1:], dtype=np.float32)
            chunks.append(logp.tobytes())
            offsets.append(offsets[-1] + logp.nbytes)
            if "advantages" in datum.loss_fn_inputs:
                adv = np.array(datum.loss_fn_inputs["advantages"], dtype=np.float64)
                ratio = np.exp(logp - np.array(datum.loss_fn_inputs["logprobs"], dtype=np.float64))
                per_token = np.maximum(-adv * ratio, -adv * np.clip(ratio, 1 - low, 1 + high))
                loss += float(per_token.sum())
        field_.data = b"".join(chunks)
        field_.offsets = np.array(offsets, dtype=np.int64).tobytes()
        out.metrics["loss:sum"] = loss
        return out.SerializeToString()

    def _optim_step(self, request: Request) -> Response:
        body = request.json
        params = body.get("adam_params") or body.get("optim_params") or body.get("optimizer_params") or {}
        model = self.models[body["model_id"]]
        model.steps += 1
        self.optim_steps.append({"model_id": model.model_id, "step": model.steps, **params})
        return self._future({"type": "optim_step", "metrics": {"step": float(model.steps)}})

    def checkpoint_path(self, model_id: str, kind: str, name: str) -> str:
        return f"tinker://{model_id}/{kind}/{name}"

    def _save_weights(self, request: Request) -> Response:
        model = self.models[request.json["model_id"]]
        path = self.checkpoint_path(model.model_id, "weights", str(request.json.get("path") or model.steps))
        model.saved[path] = model.steps
        return self._future({"type": "save_weights", "path": path})

    def _weights_info(self, request: Request) -> Response:
        path = request.json["tinker_path"]
        owner = next((m for m in self.models.values() if path in m.saved), None)
        if owner is None:
            return Response(404, {"detail": f"no checkpoint {path}"})
        return Response(body={"base_model": owner.base_model, "is_lora": True, "lora_rank": owner.rank})

    def _load_weights(self, request: Request) -> Response:
        """Onto an existing model (model_id), or, with session_id + model_seq_id, into a new training run
        (ServiceClient.create_training_client_from_state*): the new run continues at the checkpoint's step."""
        path = request.json["path"]
        owner = next((m for m in self.models.values() if path in m.saved), None)
        if owner is None:
            return self._future({"error": f"checkpoint {path} not found", "category": "user"})
        if request.json.get("model_id"):
            model = self.models[request.json["model_id"]]
        else:
            model_id = f"{request.json['session_id']}:train:{request.json['model_seq_id']}"
            model = _Model(model_id=model_id, base_model=owner.base_model, rank=owner.rank)
            self.models[model.model_id] = model
        model.steps = owner.saved[path]
        self.loads.append(
            {"path": path, "model_id": model.model_id, "optimizer": request.json.get("optimizer")}
        )
        return self._future({"type": "load_weights", "path": path, "model_id": model.model_id})

    # ------------------------------------------------------------------ weights out

    def _save_weights_for_sampler(self, request: Request) -> Response:
        model = self.models[request.json["model_id"]]
        name = request.json.get("path") or f"step-{model.steps}"
        path = self.checkpoint_path(model.model_id, "sampler_weights", name)
        model.saved[path] = model.steps
        sampler_id = None
        if request.json.get("sampling_session_seq_id") is not None:
            sampler_id = self._new_sampler(model.base_model, path)
        return self._future(
            {"type": "save_weights_for_sampler", "path": path, "sampling_session_id": sampler_id}
        )

    def _save_weights_external(self, request: Request) -> Response:
        model = self.models[request.json["model_id"]]
        name = request.json["path"]
        out = self.artifacts_dir / model.model_id / "external_weights" / name
        self.export_lora(model, out)
        path = f"tinker://{model.model_id}/external_weights/{name}"
        model.saved[path] = model.steps
        size = sum(f.stat().st_size for f in out.iterdir())
        return self._future({"type": "save_weights_external", "path": path, "size_bytes": size})

    def export_lora(self, model: _Model, out: Path) -> Path:
        """A real PEFT LoRA for the tiny model, seeded by the run and step so each save differs. Its update
        is small, as one training step's would be: the promotion gate rejects one that wrecks the model."""
        from workers.tiny_model.builder import make_lora_adapter

        seed = int(hashlib.sha256(f"{model.model_id}:{model.steps}".encode()).hexdigest()[:8], 16)
        make_lora_adapter(
            self.base_model_dir, out, seed=seed, rank=min(model.rank, 16), alpha=2 * min(model.rank, 16),
            b_std=0.002,
        )
        config_path = out / "adapter_config.json"
        config = json.loads(config_path.read_text())
        config["base_model_name_or_path"] = model.base_model  # what a real export names: the hub id
        config_path.write_text(json.dumps(config, indent=2))
        return out

    def _external_weights_urls(self, request: Request) -> Response:
        run, ckpt = request.params["run"], request.params["ckpt"]
        model = self.models.get(run)
        directory = self.artifacts_dir / run / ckpt
        if model is None or not directory.is_dir():
            return Response(404, {"detail": f"no checkpoint {ckpt} for {run}"})
        urls = {}
        for file in sorted(directory.iterdir()):
            token = secrets.token_urlsafe(12)
            self.files[token] = file
            urls[file.name] = f"{self.url}/signed/{token}/{file.name}"
        expires = (datetime.now(UTC) + timedelta(hours=1)).isoformat()
        return Response(body={"urls": urls, "expires": expires})

    def _download(self, request: Request) -> Response:
        file = self.files.get(request.params["token"])
        if file is None or file.name != request.params["name"]:
            return Response(403, b"<Error>SignatureDoesNotMatch</Error>", content_type="application/xml")
        return Response(body=file.read_bytes(), content_type="application/octet-stream")

    # ------------------------------------------------------------------ sampling

    def _new_sampler(self, base_model: str | None, model_path: str | None) -> str:
        sampler_id = self._new_id("sampler")
        self.samplers[sampler_id] = {"base_model": base_model, "model_path": model_path}
        return sampler_id

    def _create_sampling_session(self, request: Request) -> Response:
        sampler_id = self._new_sampler(request.json.get("base_model"), request.json.get("model_path"))
        return Response(body={"type": "create_sampling_session", "sampling_session_id": sampler_id})

    def _get_sampler(self, request: Request) -> Response:
        sampler = self.samplers.get(request.params["sampler_id"])
        if sampler is None:
            return Response(404, {"detail": "unknown sampler"})
        return Response(body={"sampler_id": request.params["sampler_id"], **sampler})

    def _asample(self, request: Request) -> Response:
        body = request.json
        tokens: list[int] = []
        for chunk in body["prompt"]["chunks"]:
            tokens += chunk["tokens"]
        out = pb.SampleResponse()
        if body.get("prompt_logprobs"):
            self.logprob_requests.append(tokens)
            logprobs = self.logprobs.token_logprobs(tokens)
            last_n = body.get("prompt_logprobs_last_n")
            if last_n:
                logprobs = [math.nan] * (len(logprobs) - last_n) + logprobs[-last_n:]
            out.prompt_logprobs = np.array(logprobs, dtype=np.float32).tobytes()
        k = body.get("topk_prompt_logprobs") or 0
        if k:
            self.topk_requests.append((tokens, k))
            ids, logprobs = self.logprobs.topk(tokens, k)
            out.topk_prompt_logprobs.token_ids = ids.tobytes()
            out.topk_prompt_logprobs.logprobs = logprobs.tobytes()
            out.topk_prompt_logprobs.k = k
            out.topk_prompt_logprobs.length = len(tokens)
        sequence_ids = []
        for _ in range(body.get("num_samples", 1)):
            seq = out.sequences.add(stop_reason=pb.STOP_REASON_LENGTH)
            seq.tokens = np.array(tokens[-1:], dtype=np.int32).tobytes()
            seq.logprobs = np.array([-1.0], dtype=np.float32).tobytes()
            sequence_ids.append(self._new_id("seq"))
        # The promise names each sequence at submission time; the SDK stamps these on the result.
        return self._future(out.SerializeToString(), PROTO, sample_sequence_ids=sequence_ids)
