"""What the stack serves a tenant, measured through /v1 side turns (never trained on): held-out compliance and
the capability guard; and, read back from /api/, how the tenant's judge read the users and where an update's
seconds went from the feedback to the adapter served."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.client import BenchError, temperature
from clawhub.devtools.personas.config import BenchConfig
from clawhub.devtools.personas.tracks import Track, agreement, request_seed
from workers.trainer import capability as C


def side_answers(track: Track, requests: list[tuple[list[dict], dict]], *, config: BenchConfig,
                 tag: str) -> list[tuple[str, str]]:
    """(reply, finish reason) for ``requests`` (messages, sampling) through /v1 as side turns, never
    trained on."""

    def answer(i: int) -> tuple[str, str]:
        messages, sampling = requests[i]
        response = track.owner.client.chat.completions.create(
            model=track.model, messages=messages, seed=request_seed(config.seed, "eval", i),
            extra_headers={"X-Session-Id": f"bench-eval-{tag}-{track.name}-{uuid.uuid4().hex[:8]}",
                           "X-Turn-Type": "side", "X-Session-Done": "true"},
            **sampling,
        )
        choice = response.choices[0]
        return choice.message.content or "", choice.finish_reason or ""

    if config.eval_concurrency <= 1:
        return [answer(i) for i in range(len(requests))]
    # vLLM batches concurrent requests: a few in flight measure faster than one at a time.
    with ThreadPoolExecutor(max_workers=config.eval_concurrency) as pool:
        return list(pool.map(answer, range(len(requests))))


def measure(track: Track, *, config: BenchConfig, tag: str, system: str | None = None) -> float:
    """Held-out compliance of what the tenant is served now: every held-out prompt ``eval_samples``
    times at the eval temperature, scored by the persona's rubric. ``system``: with that system prompt.
    A reply cut at ``eval_max_tokens`` is an unfinished answer: it does not comply, whatever it says so
    far (two sentences of a long answer are not a brief one)."""
    sampling = {"max_tokens": config.eval_max_tokens, **temperature(config.eval_temperature)}
    asked = [prompt for prompt in P.held_out_prompts() for _ in range(config.eval_samples)]
    requests = [(P.held_out_messages(prompt, system), sampling) for prompt in asked]
    replies = side_answers(track, requests, config=config, tag=tag)
    kept = [finish != "length" and P.complies(track.persona, text, prompt.topic)
            for (text, finish), prompt in zip(replies, asked, strict=True)]
    return sum(kept) / len(kept)


def capability(track: Track, *, config: BenchConfig, tag: str) -> float:
    """The capability guard's accuracy of what the tenant is served now (greedy)."""
    sampling = {"max_tokens": C.MAX_TOKENS, "temperature": 0.0}
    replies = side_answers(track, [(C.messages(q), sampling) for q, _ in C.QUESTIONS], config=config,
                           tag=tag)
    return C.accuracy([text for text, _ in replies])


def judge_agreement(track: Track) -> dict[str, Any]:
    """How the tenant's judge read the users' reactions, against what the users meant
    (``Reaction.pleased``): a sample's reward +1/-1 agrees when the user was pleased/displeased; a
    reaction with no sample was not judged either way (no rule matched, or the turn was not judged)."""
    api = track.owner.api
    page = api.get("/api/review/samples/", params={"tenant": track.tenant_id, "page_size": 500})
    read: dict[str, int] = {}
    for sample in page["results"]:
        detail = api.get(f"/api/review/samples/{sample['id']}/")
        for message in detail.get("next_state") or []:
            text = message.get("content")
            if message.get("role") == "user" and isinstance(text, str) and text in track.truth:
                read[text] = detail["reward"]
    return agreement(track.truth, read)


def feedback_times(track: Track, sample_ids: list[int]) -> list[float]:
    """When the bench sent the feedback (next state) of each sample in the batch."""
    times = []
    for sample_id in sample_ids:
        try:
            detail = track.owner.api.get(f"/api/review/samples/{sample_id}/")
        except BenchError:
            continue
        texts = [m.get("content") for m in detail.get("next_state") or [] if m.get("role") == "user"]
        for text in texts:
            if isinstance(text, str) and text in track.feedback_sent:
                times.append(track.feedback_sent[text])
    return times


def _timestamp(value: str | None) -> float | None:
    from datetime import datetime

    return datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp() if value else None


def feedback_stages(*, last_feedback: float, run: dict, version: dict, seen: float) -> dict[str, float]:
    """Where the seconds from the batch's newest feedback to its adapter being served went, from the run's
    and version's own timestamps: judged, reviewed and claimed into a run (``to_claim``), waiting for a train
    worker (``queued``), training incl. loading the base and exporting (``train``), the promotion gate and
    loading the adapter on the upstreams (``gate_and_load``), and until the bench saw it (``noticed``)."""
    created, started = _timestamp(run.get("created_at")), _timestamp(run.get("started_at"))
    finished, promoted = _timestamp(run.get("finished_at")), _timestamp(version.get("promoted_at"))
    marks = [("to_claim", last_feedback, created), ("queued", created, started), ("train", started, finished),
             ("gate_and_load", finished, promoted), ("noticed", promoted, seen)]
    return {name: round(end - begin, 1) for name, begin, end in marks if None not in (begin, end)}
