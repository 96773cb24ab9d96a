"""Drives a running ClawHub like real users, over HTTP only, and measures how fast each training method
teaches the personas' preferences.

Per method (rl, opd, combine), on the same seed, with fresh users so that no two runs share an adapter:

1. Sign-up through /api/auth/, a key through /api/keys/, judge rules through /api/judge-rules/ (the rule
   judge, or ``--judge llm``), the review policy through /api/review/tenants/<id>/policy/ (auto for a
   personal tenant, flagged for the group), and the training method through /api/training/.../settings/.
2. The scripted users chat through /v1 with the real ``openai`` SDK: one session per X-Session-Id, each
   user message the previous reply's next state, the last request marked X-Session-Done.
3. Review, as the tenant's reviewer would do it through /api/review/samples/bulk/:
   - a personal tenant's auto policy approves its samples itself (its new-key age is 0); in a group, every
     bench key is minutes old, so the new-key guard (feedback through a key younger than the policy's
     ``new_key_age``, 24 h) holds all of them; the bench approves samples whose only flags are ``new_key``
     (and ``split_votes``, which only the LLM judge produces);
   - in the group, the bench acts as the owner: samples flagged ``member_outlier`` or
     ``consensus_disagreement`` are rejected (the adversary's, once its negative rate or its disagreement
     with the other members on the same reply style stands out; its first samples are approved as anyone's,
     wait on the guard's probation until it has compared the adversary with the others, and come back to
     review flagged when it does); anything else flagged (near duplicates, revoked keys) stays pending, as
     it would for a careful admin.
4. With a full batch approved, it starts the run (POST .../runs/start/; the periodic kick may win the race,
   which is the same run), waits for it, for the eval gate and the promotion, then measures compliance on the
   fixed held-out prompts through /v1 (at the served temperature, several samples each, side turns so they
   are never trained on), scored by the persona's rubric, not by the judge; the capability guard too.

Tracks per method: one per persona (the primary one by default), and with ``group``, the group with an
adversarial member and (unless ``--no-group-control``) the same group with three honest members, whose
difference is the adversary's effect.
One JSON line per method; a PNG of compliance against promoted updates.
"""

from __future__ import annotations

import json
import logging
import random
import re
import secrets
import statistics
import sys
import time
import uuid
import zlib
from collections.abc import Callable, Iterable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from html import unescape
from pathlib import Path
from typing import Any

import httpx

from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.plots import line_chart_png
from workers.trainer import capability as C

logger = logging.getLogger("clawhub.devtools.personas")

METHODS = ("rl", "opd", "combine")
# The trainer's own defaults (LoRA rate 1e-4): what a user of the real model gets.
DEFAULT_OVERRIDES: dict[str, Any] = {}
APPROVABLE_FLAGS = {"new_key", "split_votes"}
REJECTED_FLAGS = {"member_outlier", "consensus_disagreement"}


class BenchError(RuntimeError):
    pass


def compliance_png(tracks: dict[str, list[Track]], *, title: str, target: float) -> bytes:
    """Held-out compliance per update, one line per method and track."""
    series = {f"{method} {track.name}": track.curve() for method, of_method in tracks.items()
              for track in of_method}
    return line_chart_png(series, title=title, target=target)


def write_results(out: Path, results: list[dict[str, Any]], plot: bytes) -> Path:
    """``results.jsonl`` (one line per method) and ``compliance.png`` in ``out``; the plot's path."""
    out.mkdir(parents=True, exist_ok=True)
    with open(out / "results.jsonl", "w") as f:
        for result in results:
            f.write(json.dumps(result) + "\n")
    path = out / "compliance.png"
    path.write_bytes(plot)
    return path


def check_users(*, methods, personas, phrasings: str, noise: float) -> None:
    """What both tracks (the stack's and the in-process one) ask of the methods and the simulated users."""
    unknown = [m for m in methods if m not in METHODS]
    if unknown:
        raise ValueError(f"unknown methods {unknown}; choose from {list(METHODS)}")
    bad = [p for p in personas if p not in P.PERSONAS]
    if bad:
        raise ValueError(f"unknown personas {bad}; choose from {list(P.PERSONAS)}")
    if phrasings not in ("training", "held-out"):
        raise ValueError("phrasings is 'training' or 'held-out'")
    if not 0 <= noise < 0.5:
        raise ValueError("noise is a rate in [0, 0.5): above that the users mean the opposite")


@dataclass
class BenchConfig:
    base_url: str = "http://127.0.0.1:8000"
    methods: tuple[str, ...] = METHODS
    seed: int = 0
    noise: float = P.NOISE_RATE  # share of the simulated users' reactions that are the opposite of deserved
    max_updates: int = 16
    judge: str = "rule"
    out_dir: Path = Path("bench-output")
    personas: tuple[str, ...] = (P.PRIMARY.name,)
    group: bool = False
    group_control: bool = True
    phrasings: str = "training"  # which half of each reaction pool the users speak from
    batch_size: int = 16
    turns_per_session: int = 2  # judged replies per session; one closing request follows
    overrides: dict[str, Any] = field(default_factory=lambda: dict(DEFAULT_OVERRIDES))
    # Short limits keep an update affordable on a CPU: at ~10 tokens/s, every token of every sample counts.
    chat_max_tokens: int = 96
    chat_temperature: float | None = 0.7  # exploration; None: the served default
    eval_max_tokens: int = 64  # a brief answer (<= ~45 words) finishes within it
    eval_temperature: float | None = None  # None: the served default, as a user's client gets
    eval_samples: int = P.EVAL_SAMPLES  # samples per held-out prompt
    eval_concurrency: int = 8
    # Sessions chatting at once while a batch is collected: vLLM batches them (one at a time, a CPU server
    # spends most of each step on overhead).
    parallel_sessions: int = 4
    capability: bool = True  # ask the capability guard of the base and every promoted version
    prompt_only: bool = True  # measure the base with the preference as its system prompt
    target: float = 0.8
    stop_at_target: bool = False
    update_timeout: float = 1800.0
    judge_wait: float = 180.0  # how long to wait for feedback already sent to be judged before chatting more
    serve_grace: float = 3.0  # the gateway caches a tenant's active adapter this long (GATEWAY_ADAPTER_CACHE)
    poll: float = 2.0

    def __post_init__(self) -> None:
        check_users(methods=self.methods, personas=self.personas, phrasings=self.phrasings, noise=self.noise)
        if self.judge not in ("rule", "llm"):
            raise ValueError("judge is 'rule' or 'llm'")
        if self.max_updates < 1 or self.batch_size < 1 or self.turns_per_session < 1:
            raise ValueError("max_updates, batch_size and turns_per_session must be at least 1")


# --- HTTP: the web API as a signed-in browser uses it ------------------------------------------------------


class Api:
    """A session-authenticated client of /api/ (CSRF token from the cookie on every write)."""

    def __init__(self, base_url: str, *, timeout: float = 60.0, transport: httpx.BaseTransport | None = None):
        self.base_url = base_url.rstrip("/")
        self.http = httpx.Client(base_url=self.base_url, timeout=timeout, transport=transport)

    def close(self) -> None:
        self.http.close()

    def request(self, method: str, path: str, body: Any = None, *, ok: Iterable[int] = (200, 201, 202, 204),
                params: dict | None = None) -> httpx.Response:
        headers = {}
        if method != "GET":
            headers["X-CSRFToken"] = self.http.cookies.get("csrftoken", "")
        response = self.http.request(method, path, json=body, params=params, headers=headers)
        if response.status_code not in set(ok):
            raise BenchError(f"{method} {path} -> {response.status_code}: {response.text[:500]}")
        return response

    def get(self, path: str, **kw) -> Any:
        return self.request("GET", path, **kw).json()

    def post(self, path: str, body: Any = None, **kw) -> httpx.Response:
        return self.request("POST", path, body if body is not None else {}, **kw)

    def signup(self, email: str, password: str) -> dict:
        """Signs up, then logs in (sign-up signs nobody in); returns the user."""
        self.request("GET", "/api/auth/csrf/")
        self.post("/api/auth/signup/", {"email": email, "password": password})
        return self.post("/api/auth/login/", {"email": email, "password": password}).json()["user"]

    def tenant_ids(self) -> dict[str, int]:
        """label -> tenant id, read from the training page, which also shows that the tenant is listed there
        (/api/me/ and /api/groups/<slug>/ carry the same ``tenant_id``)."""
        return tenant_ids_from_html(self.request("GET", "/training/").text)


def tenant_ids_from_html(html: str) -> dict[str, int]:
    """The training page's table: each row's first cell (the tenant's label) and its /training/<id>/ link."""
    found = {}
    for row in re.findall(r"<tr>(.*?)</tr>", html, flags=re.S):
        match = re.search(r"<td>(.*?)</td>.*?href=\"/training/(\d+)/\"", row, flags=re.S)
        if match:
            found[unescape(re.sub(r"\s+", " ", match.group(1)).strip())] = int(match.group(2))
    return found


# --- users and tenants --------------------------------------------------------------------------------------


@dataclass
class Member:
    email: str
    api: Api
    user: P.ScriptedUser
    secret: str = ""
    client: Any = None  # openai.OpenAI
    sessions: int = 0


@dataclass
class UpdateRecord:
    update: int  # promoted updates so far
    attempt: int
    run_id: int | None
    version: int | None
    outcome: str  # active, rejected, failed, timeout
    compliance: float | None
    sessions: int  # simulated sessions so far, all members together
    samples: int
    feedback_to_served_s: float | None  # newest feedback turn in the batch -> the adapter served
    oldest_feedback_to_served_s: float | None
    run_to_served_s: float | None
    capability: float | None = None  # the capability guard's accuracy of this version
    wall_s: float | None = None  # the whole update: chatting, judging, review, training, gate, measuring
    eval_score: float | None = None
    baseline_score: float | None = None
    decision: str = ""  # the promotion gate's decision and its reason, as the version page shows them
    decision_reason: str = ""
    # Where feedback→served went (seconds): see feedback_stages.
    stages: dict[str, float] = field(default_factory=dict)


@dataclass
class Track:
    """One tenant under test: its members (the first manages it), what it prefers, and its history."""

    name: str
    persona: P.Persona
    members: list[Member]
    model: str
    tenant_id: int = 0
    slug: str = ""
    records: list[UpdateRecord] = field(default_factory=list)
    base_compliance: float | None = None
    base_capability: float | None = None
    prompt_only_compliance: float | None = None  # the base with the preference as its system prompt
    sessions: int = 0
    attempts: int = 0
    done: bool = False
    error: str = ""
    feedback_sent: dict[str, float] = field(default_factory=dict)  # feedback text -> when it was sent
    truth: dict[str, bool] = field(default_factory=dict)  # feedback text -> whether the user was pleased
    judge_agreement: dict[str, Any] = field(default_factory=dict)
    # member email -> that member's sessions when the bench first saw the consensus guard flag them
    consensus_flagged: dict[str, int] = field(default_factory=dict)

    @property
    def owner(self) -> Member:
        return self.members[0]

    @property
    def promoted(self) -> list[UpdateRecord]:
        return [r for r in self.records if r.outcome == "active"]

    def curve(self) -> list[float | None]:
        return [self.base_compliance, *[r.compliance for r in self.promoted]]

    def capability_curve(self) -> list[float | None]:
        return [self.base_capability, *[r.capability for r in self.promoted]]

    def summary(self, target: float) -> dict[str, Any]:
        curve = self.curve()
        reached = next((i for i, c in enumerate(curve) if c is not None and c >= target), None)
        promoted = self.promoted
        served = [r.feedback_to_served_s for r in promoted if r.feedback_to_served_s is not None]
        return {
            "tenant": self.tenant_id,
            "compliance": [None if c is None else round(c, 4) for c in curve],
            "capability": [None if c is None else round(c, 4) for c in self.capability_curve()],
            "prompt_only": (None if self.prompt_only_compliance is None
                            else round(self.prompt_only_compliance, 4)),
            "update_wall_s": [None if r.wall_s is None else round(r.wall_s, 1) for r in promoted],
            "judge_agreement": self.judge_agreement or None,
            "updates_promoted": len(promoted),
            "updates_attempted": self.attempts,
            "updates_rejected": sum(r.outcome == "rejected" for r in self.records),
            "updates_to_target": reached,
            "sessions_to_target": None if reached is None else 0 if reached == 0
            else promoted[reached - 1].sessions,
            "sessions": self.sessions,
            "feedback_to_served_s": [round(s, 1) for s in served],
            "feedback_to_served_median_s": round(statistics.median(served), 1) if served else None,
            "feedback_to_served_stages_s": [r.stages for r in promoted],
            "eval_scores": [r.eval_score for r in promoted],
            "gate": [{"version": r.version, "outcome": r.outcome, "decision": r.decision,
                      "reason": r.decision_reason} for r in self.records if r.version is not None],
            "consensus_flagged_after_sessions": dict(self.consensus_flagged),
            "error": self.error or None,
        }


def _openai_client(base_url: str, secret: str) -> Any:
    import openai

    # Generations on a busy CPU can take minutes; a timeout is a failure of the stack, not of the bench.
    return openai.OpenAI(base_url=f"{base_url.rstrip('/')}/v1", api_key=secret, max_retries=2, timeout=600)


def _temperature(value: float | None) -> dict[str, float]:
    """The request's temperature, or none: vLLM then samples at the model's served default."""
    return {} if value is None else {"temperature": value}


def agreement(truth: dict[str, bool], read: dict[str, int]) -> dict[str, Any]:
    """Reactions the judge read (+1 / -1) against what the users meant: ``agreement`` over those judged,
    ``coverage`` the share judged at all; ``pleased_read`` / ``displeased_read`` per class."""
    judged = [(truth[text], reward) for text, reward in read.items() if text in truth and reward]
    agree = sum((reward > 0) == pleased for pleased, reward in judged)
    pleased = [r for p, r in judged if p]
    displeased = [r for p, r in judged if not p]
    return {
        "reactions": len(truth), "judged": len(judged),
        "coverage": round(len(judged) / len(truth), 4) if truth else None,
        "agreement": round(agree / len(judged), 4) if judged else None,
        "pleased": sum(truth.values()), "pleased_read_positive": sum(r > 0 for r in pleased),
        "displeased": len(truth) - sum(truth.values()),
        "displeased_read_negative": sum(r < 0 for r in displeased),
    }


def request_seed(*parts: Any) -> int:
    return zlib.crc32(":".join(map(str, parts)).encode()) & 0x7FFFFFFF


def review_decisions(samples: list[dict], *, group: bool) -> tuple[list[int], list[int]]:
    """(approve, reject) among pending samples, by their flags: see the module's docstring, step 3."""
    approve, reject = [], []
    for sample in samples:
        if sample.get("state") != "pending":
            continue
        codes = {f.get("code", "") for f in sample.get("flags") or []}
        if group and codes & REJECTED_FLAGS:
            reject.append(sample["id"])
        elif codes <= APPROVABLE_FLAGS:
            approve.append(sample["id"])
    return approve, reject


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


# --- the benchmark ------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, config: BenchConfig, *, echo: Callable[[str], None] = print,
                 log: Callable[[str], None] | None = None, transport: httpx.BaseTransport | None = None,
                 client_factory: Callable[[str, str], Any] | None = None):
        """``transport`` (for /api/) and ``client_factory(base_url, secret)`` (for /v1) stand in for the
        network in tests; by default the bench talks to ``config.base_url`` with httpx and ``openai``."""
        self.config = config
        self.transport = transport
        self.client_factory = client_factory or _openai_client
        self.echo = echo  # the result lines (one JSON object per method)
        self.log = log or (lambda line: print(line, file=sys.stderr))  # progress, for people watching
        self.tag = f"s{config.seed}-{time.strftime('%m%d%H%M%S')}-{secrets.token_hex(2)}"
        self.password = "bench-" + secrets.token_urlsafe(18)
        self.results: list[dict[str, Any]] = []
        self.tracks: dict[str, list[Track]] = {}

    # --- setup ----------------------------------------------------------------------------------------

    def _member(self, method: str, role: str, persona: P.Persona, *, adversarial: bool = False,
                 user_seed: str = "") -> Member:
        email = f"bench-{self.tag}-{method}-{role}@example.com"
        api = Api(self.config.base_url, transport=self.transport)
        api.signup(email, self.password)
        # Same seed -> same users: prompt order and phrasing depend on the persona and role, not the method.
        rng = random.Random(f"{self.config.seed}:{user_seed or role}")
        user = P.ScriptedUser(persona=persona, rng=rng, adversarial=adversarial, noise=self.config.noise,
                              phrasings=self.config.phrasings)
        return Member(email=email, api=api, user=user)

    def _key(self, member: Member, group: str | None = None) -> None:
        body = {"name": "bench"} | ({"group": group} if group else {})
        member.secret = member.api.post("/api/keys/", body).json()["secret"]
        member.client = self.client_factory(self.config.base_url, member.secret)

    def _configure(self, track: Track, method: str, *, mode: str) -> None:
        api, cfg = track.owner.api, self.config
        rules = dict(P.JUDGE_RULES, judge=cfg.judge)
        path = f"/api/groups/{track.slug}/judge-rules/" if track.slug else "/api/judge-rules/"
        api.request("PUT", path, rules)
        api.request("PATCH", f"/api/review/tenants/{track.tenant_id}/policy/", {"mode": mode})
        api.request("PATCH", f"/api/training/tenants/{track.tenant_id}/settings/",
                    {"method": method, "overrides": cfg.overrides, "batch_size": cfg.batch_size,
                     "auto_start": True}, ok=(200,))
        # A reply cut at chat_max_tokens ("length") is kept out of judging by default; the benchmark's users
        # react to it like any other (a cut reply is a long one to the brief user).
        api.request("PATCH", f"/api/conversations/tenants/{track.tenant_id}/settings/",
                    {"include_length_turns": True}, ok=(200,))

    def setup_personal(self, method: str, persona: P.Persona) -> Track:
        member = self._member(method, persona.name, persona)
        self._key(member)
        tenant_id = member.api.tenant_ids().get(f"personal: {member.email}")
        if not tenant_id:
            raise BenchError(f"no personal tenant listed on /training/ for {member.email}")
        track = Track(name=persona.name, persona=persona, members=[member], model="clawhub-personal",
                      tenant_id=tenant_id)
        self._configure(track, method, mode="auto")
        return track

    def setup_group(self, method: str, *, adversarial: bool) -> Track:
        name = "group" if adversarial else "group-control"
        roles = ["owner", "member", "adversary" if adversarial else "member2"]
        # The control group's users are the adversarial group's users with the third one honest (same seeds).
        members = [self._member(method, f"{name}-{role}", P.PRIMARY, adversarial=role == "adversary",
                                user_seed=f"group-{i}") for i, role in enumerate(roles)]
        owner = members[0]
        slug = f"bench-{self.tag}-{method}-{name}".lower()[:60]
        owner.api.post("/api/groups/", {"name": f"Bench {method} {name}", "slug": slug})
        for i, member in enumerate(members[1:]):
            # The second member is an admin: review lets nobody approve their own feedback, so the owner's
            # samples are approved by that admin.
            role = "admin" if i == 0 else "member"
            link = owner.api.post(f"/api/groups/{slug}/invitations/", {"role": role}).json()["link"]
            token = link.rstrip("/").split("/")[-1]
            member.api.post(f"/api/invitations/{token}/accept/")
        for member in members:
            self._key(member, group=slug)
        tenant_id = owner.api.tenant_ids().get(f"group {slug}")
        if not tenant_id:
            raise BenchError(f"no tenant listed on /training/ for group {slug}")
        track = Track(name=name, persona=P.PRIMARY, members=members, model=f"clawhub-group-{slug}",
                      tenant_id=tenant_id, slug=slug)
        self._configure(track, method, mode="flagged")
        return track

    # --- chatting ---------------------------------------------------------------------------------------

    def _chat(self, member: Member, track: Track, messages: list[dict], session: str, *, n: int,
              done: bool = False, max_tokens: int | None = None) -> str:
        headers = {"X-Session-Id": session} | ({"X-Session-Done": "true"} if done else {})
        response = member.client.chat.completions.create(
            model=track.model, messages=messages, max_tokens=max_tokens or self.config.chat_max_tokens,
            seed=request_seed(self.config.seed, session, n), extra_headers=headers,
            **_temperature(self.config.chat_temperature),
        )
        return response.choices[0].message.content or ""

    def run_session(self, track: Track, member: Member, user: P.ScriptedUser | None = None,
                    number: int | None = None) -> int:
        """One conversation of ``turns_per_session`` judged replies and a closing message, by ``user`` (the
        member's own by default; a fork of it when sessions run in parallel). Returns the feedback messages
        sent (each the next state of a reply)."""
        cfg = self.config
        user = user or member.user
        session = f"bench-{self.tag}-{track.name}-{track.sessions if number is None else number}-" \
                  f"{uuid.uuid4().hex[:6]}"
        text, prompt = user.open_session()
        messages = [{"role": "user", "content": text}]
        sent = 0
        for turn in range(cfg.turns_per_session):
            reply = self._chat(member, track, messages, session, n=turn)
            last = turn == cfg.turns_per_session - 1
            reaction = user.react(reply, prompt, last=last)
            messages += [{"role": "assistant", "content": reply}, {"role": "user", "content": reaction.text}]
            track.feedback_sent[reaction.text] = time.time()
            track.truth[reaction.text] = reaction.pleased
            sent += 1
            if last or reaction.prompt is None:
                # The closing request carries the feedback; its own reply is never judged (no next state).
                self._chat(member, track, messages, session, n=turn + 1, done=True, max_tokens=8)
                break
            prompt = reaction.prompt
        if number is None:
            member.sessions += 1
            track.sessions += 1
        return sent

    def run_sessions(self, track: Track, members: list[Member]) -> int:
        """One session per member in ``members`` at once (each by a fork of its user, drawn here in order, so
        a seed gives the same users whatever the threads do). Returns the feedback messages sent."""
        if len(members) == 1:
            return self.run_session(track, members[0])
        forks = [(member, member.user.fork(), track.sessions + i) for i, member in enumerate(members)]
        with ThreadPoolExecutor(max_workers=len(forks)) as pool:
            sent = sum(pool.map(lambda job: self.run_session(track, *job), forks))
        for member, _, _ in forks:
            member.sessions += 1
        track.sessions += len(forks)
        return sent

    # --- review and training ----------------------------------------------------------------------------

    def review(self, track: Track) -> tuple[int, int]:
        api = track.owner.api
        page = api.get("/api/review/samples/", params={"tenant": track.tenant_id, "state": "pending",
                                                       "page_size": 500})
        approve, reject = review_decisions(page["results"], group=bool(track.slug))
        authors = {s["id"]: (s.get("user") or {}).get("email") for s in page["results"]}
        sessions = {m.email: m.sessions for m in track.members}
        for sample in page["results"]:
            email = authors.get(sample["id"])
            if any(f.get("code") == "consensus_disagreement" for f in sample.get("flags") or []):
                track.consensus_flagged.setdefault(email, sessions.get(email, 0))
        own = [i for i in approve if authors.get(i) == track.owner.email]
        admin = track.members[1].api if track.slug else api  # a group's owner may not approve their own
        for reviewer, ids in ((api, [i for i in approve if i not in own]), (admin, own)):
            if ids:
                reviewer.post("/api/review/samples/bulk/", {
                    "ids": ids, "action": "approve",
                    "reason": "bench: only the new-key guard held it (bench keys are minutes old)"})
        if reject:
            api.post("/api/review/samples/bulk/", {
                "ids": reject, "action": "reject",
                "reason": "bench: member_outlier or consensus_disagreement flagged by the group's guards"})
        return len(approve), len(reject)

    def _counts(self, track: Track) -> tuple[int, int]:
        """(trainable now, samples created so far) for the tenant."""
        api = track.owner.api
        trainable = api.get(f"/api/training/tenants/{track.tenant_id}/settings/")["trainable"]
        total = api.get("/api/review/samples/", params={"tenant": track.tenant_id, "page_size": 1})["count"]
        return trainable, total

    def collect_batch(self, track: Track) -> None:
        """Chats until a full batch is approved: more sessions while too little feedback is in flight, waiting
        for the judge while enough is."""
        cfg = self.config
        sent = 0
        _, seen_before = self._counts(track)
        waited_since = None
        rotation = 0
        while True:
            self.review(track)
            trainable, total = self._counts(track)
            if trainable >= cfg.batch_size or self._open_run(track):
                return  # a full batch, or the periodic kick already started a run with one
            in_flight = sent - (total - seen_before)
            if in_flight >= cfg.batch_size - trainable:
                waited_since = waited_since or time.monotonic()
                if time.monotonic() - waited_since > cfg.judge_wait:
                    raise BenchError(f"{track.name}: {in_flight} feedback turns not judged after "
                                     f"{cfg.judge_wait:.0f} s (is the worker consuming the judge queue?)")
                time.sleep(cfg.poll)
                continue
            waited_since = None
            missing = cfg.batch_size - trainable - max(in_flight, 0)
            count = max(1, min(cfg.parallel_sessions, -(-missing // cfg.turns_per_session)))
            members = [track.members[(rotation + i) % len(track.members)] for i in range(count)]
            rotation += count
            sent += self.run_sessions(track, members)

    def _open_run(self, track: Track) -> dict | None:
        runs = track.owner.api.get(f"/api/training/tenants/{track.tenant_id}/runs/",
                                   params={"page_size": 1})["results"]
        return runs[0] if runs and runs[0]["state"] in ("queued", "running") else None

    def start_run(self, track: Track) -> dict:
        api = track.owner.api
        response = api.request("POST", f"/api/training/tenants/{track.tenant_id}/runs/start/", {},
                               ok=(201, 409))
        if response.status_code == 201:
            return response.json()
        # The periodic kick started it first: the same kind of batch, in the open run.
        run = self._open_run(track)
        if run is None:
            raise BenchError(f"{track.name}: could not start a run: {response.text[:300]}")
        return api.get(f"/api/training/runs/{run['id']}/")

    def _wait(self, probe: Callable[[], Any], deadline: float, what: str) -> Any:
        while True:
            found = probe()
            if found:
                return found
            if time.monotonic() > deadline:
                raise TimeoutError(what)
            time.sleep(self.config.poll)

    def _feedback_times(self, track: Track, sample_ids: list[int]) -> list[float]:
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

    def update(self, track: Track) -> UpdateRecord:
        """Collect a batch, train, wait for the gate, measure. One attempted update."""
        cfg = self.config
        track.attempts += 1
        began = time.monotonic()
        self.collect_batch(track)
        run = self.start_run(track)
        started = time.time()
        api = track.owner.api
        deadline = time.monotonic() + cfg.update_timeout
        record = UpdateRecord(update=len(track.promoted), attempt=track.attempts, run_id=run["id"],
                              version=None, outcome="timeout", compliance=None, sessions=track.sessions,
                              samples=run.get("samples", 0), feedback_to_served_s=None,
                              oldest_feedback_to_served_s=None, run_to_served_s=None)
        try:
            run = self._wait(lambda: (r := api.get(f"/api/training/runs/{run['id']}/"))["state"] in
                             ("succeeded", "failed", "cancelled") and r, deadline, "the training run")
            if run["state"] != "succeeded" or not run.get("adapter_version"):
                record.outcome = "failed"
                track.error = run.get("error") or run["state"]
                return record
            version_id = run["adapter_version"]["id"]
            version = self._wait(
                lambda: (v := api.get(f"/api/adapters/versions/{version_id}/"))["state"] not in
                ("candidate", "evaluating") and v, deadline, "the eval gate and promotion")
            served_at = time.time()
            record.version, record.outcome = version["version"], version["state"]
            record.eval_score = version.get("eval_score")
            record.baseline_score = version.get("baseline_score")
            record.decision = version.get("decision") or ""
            record.decision_reason = version.get("decision_reason") or ""
            self.log(f"[gate] {track.name} v{record.version}: {record.outcome} — {record.decision}: "
                     f"{record.decision_reason}")
            if record.outcome != "active":
                return record
            sent_at = self._feedback_times(track, run.get("sample_ids") or [])
            if sent_at:
                record.feedback_to_served_s = served_at - max(sent_at)
                record.oldest_feedback_to_served_s = served_at - min(sent_at)
                record.stages = feedback_stages(last_feedback=max(sent_at), run=run, version=version,
                                                seen=served_at)
                self.log(f"[served] {track.name} v{record.version}: feedback→served "
                         f"{record.feedback_to_served_s:.1f} s = {record.stages}")
            record.run_to_served_s = served_at - started
            time.sleep(cfg.serve_grace)
            record.update = len(track.promoted) + 1
            record.compliance = self.measure(track)
            if cfg.capability:
                record.capability = self.capability(track)
            record.wall_s = time.monotonic() - began
            return record
        except TimeoutError as exc:
            track.error = f"timed out waiting for {exc} after {cfg.update_timeout:.0f} s"
            return record

    def _side_answers(self, track: Track, requests: list[tuple[list[dict], dict]]) -> list[tuple[str, str]]:
        """(reply, finish reason) for ``requests`` (messages, sampling) through /v1 as side turns, never
        trained on."""
        cfg = self.config

        def answer(i: int) -> tuple[str, str]:
            messages, sampling = requests[i]
            response = track.owner.client.chat.completions.create(
                model=track.model, messages=messages, seed=request_seed(cfg.seed, "eval", i),
                extra_headers={"X-Session-Id": f"bench-eval-{self.tag}-{track.name}-{uuid.uuid4().hex[:8]}",
                               "X-Turn-Type": "side", "X-Session-Done": "true"},
                **sampling,
            )
            choice = response.choices[0]
            return choice.message.content or "", choice.finish_reason or ""

        if cfg.eval_concurrency <= 1:
            return [answer(i) for i in range(len(requests))]
        # vLLM batches concurrent requests: a few in flight measure faster than one at a time.
        with ThreadPoolExecutor(max_workers=cfg.eval_concurrency) as pool:
            return list(pool.map(answer, range(len(requests))))

    def measure(self, track: Track, *, system: str | None = None) -> float:
        """Held-out compliance of what the tenant is served now: every held-out prompt ``eval_samples``
        times at the eval temperature, scored by the persona's rubric. ``system``: with that system prompt.
        A reply cut at ``eval_max_tokens`` is an unfinished answer: it does not comply, whatever it says so
        far (two sentences of a long answer are not a brief one)."""
        cfg = self.config
        sampling = {"max_tokens": cfg.eval_max_tokens, **_temperature(cfg.eval_temperature)}
        requests = [(P.held_out_messages(prompt, system), sampling)
                    for prompt in P.held_out_prompts() for _ in range(cfg.eval_samples)]
        replies = self._side_answers(track, requests)
        kept = [finish != "length" and track.persona.complies(text) for text, finish in replies]
        return sum(kept) / len(kept)

    def capability(self, track: Track) -> float:
        """The capability guard's accuracy of what the tenant is served now (greedy)."""
        sampling = {"max_tokens": C.MAX_TOKENS, "temperature": 0.0}
        replies = self._side_answers(track, [(C.messages(q), sampling) for q, _ in C.QUESTIONS])
        return C.accuracy([text for text, _ in replies])

    def measure_base(self, track: Track) -> None:
        """The track's base figures: compliance, the capability guard, and the prompt-only baseline."""
        track.base_compliance = self.measure(track)
        if self.config.capability:
            track.base_capability = self.capability(track)
        if self.config.prompt_only:
            track.prompt_only_compliance = self.measure(track, system=track.persona.preference)

    def judge_agreement(self, track: Track) -> dict[str, Any]:
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

    # --- per method ---------------------------------------------------------------------------------------

    def run_method(self, method: str) -> dict[str, Any]:
        cfg = self.config
        began = time.monotonic()
        tracks = [self.setup_personal(method, P.PERSONAS[name]) for name in cfg.personas]
        if cfg.group:
            tracks.append(self.setup_group(method, adversarial=True))
            if cfg.group_control:
                tracks.append(self.setup_group(method, adversarial=False))
        self.tracks[method] = tracks
        for track in tracks:
            self.measure_base(track)
            self._progress(method, track, None)
        # Round robin, one update per tenant in turn, so that an interrupted run has every curve so far.
        while any(not t.done for t in tracks):
            for track in tracks:
                if track.done:
                    continue
                try:
                    record = self.update(track)
                except BenchError as exc:
                    track.error, track.done = str(exc), True
                    self.log(f"[{method}/{track.name}] stopped: {exc}")
                    continue
                track.records.append(record)
                self._progress(method, track, record)
                reached = record.compliance is not None and record.compliance >= cfg.target
                if (len(track.promoted) >= cfg.max_updates or track.attempts >= 2 * cfg.max_updates
                        or record.outcome in ("failed", "timeout") or (cfg.stop_at_target and reached)):
                    track.done = True
        for track in tracks:
            try:
                track.judge_agreement = self.judge_agreement(track)
            except BenchError as exc:
                self.log(f"[{method}/{track.name}] judge agreement not read: {exc}")
        result = self.method_result(method, tracks, wall_s=time.monotonic() - began)
        self.results.append(result)
        return result

    def method_result(self, method: str, tracks: list[Track], *, wall_s: float) -> dict[str, Any]:
        cfg = self.config
        by_name = {t.name: t for t in tracks}
        result: dict[str, Any] = {"method": method, "seed": cfg.seed, "noise": cfg.noise, "judge": cfg.judge,
                                  "phrasings": cfg.phrasings, "overrides": cfg.overrides,
                                  "batch_size": cfg.batch_size, "target": cfg.target,
                                  "max_updates": cfg.max_updates, "wall_s": round(wall_s, 1)}
        for name in cfg.personas:
            result[name] = by_name[name].summary(cfg.target)
        if "group" in by_name:
            group = {"with_adversary": by_name["group"].summary(cfg.target)}
            if "group-control" in by_name:
                group["without_adversary"] = by_name["group-control"].summary(cfg.target)
                group["adversary_shift"] = adversary_shift(group["with_adversary"]["compliance"],
                                                           group["without_adversary"]["compliance"])
            result["group"] = group
        return result

    def _progress(self, method: str, track: Track, record: UpdateRecord | None) -> None:
        line = {"method": method, "track": track.name, "tenant": track.tenant_id}
        if record is None:
            line |= {"update": 0, "compliance": track.base_compliance, "capability": track.base_capability,
                     "prompt_only": track.prompt_only_compliance}
        else:
            line |= {k: v for k, v in record.__dict__.items()}
        self.log(f"[progress] {json.dumps(line)}")
        self.config.out_dir.mkdir(parents=True, exist_ok=True)
        with open(self.config.out_dir / "progress.jsonl", "a") as f:
            f.write(json.dumps(line) + "\n")

    # --- outputs ------------------------------------------------------------------------------------------

    def plot(self) -> bytes:
        return compliance_png(self.tracks, title=f"held-out compliance, seed {self.config.seed}",
                              target=self.config.target)

    def run(self) -> list[dict[str, Any]]:
        for method in self.config.methods:
            result = self.run_method(method)
            self.echo(json.dumps(result))
            self.write_outputs()
        return self.results

    def write_outputs(self) -> Path:
        out = self.config.out_dir
        path = write_results(out, self.results, self.plot())
        # The throwaway accounts, so that a person can sign in as one and look at its dashboard.
        accounts = out / "accounts.json"
        accounts.touch()
        accounts.chmod(0o600)  # before the password goes in
        accounts.write_text(json.dumps({
            "password": self.password,
            "tenants": {f"{method} {t.name}": {"tenant": t.tenant_id, "users": [m.email for m in t.members]}
                        for method, tracks in self.tracks.items() for t in tracks},
        }, indent=2))
        return path

    def close(self) -> None:
        for tracks in self.tracks.values():
            for track in tracks:
                for member in track.members:
                    member.api.close()


def adversary_shift(with_adversary: list[float | None], without: list[float | None]) -> dict[str, Any]:
    """How far the adversarial member moved the shared compliance: control minus adversarial group, at each
    update both reached, and at the last one."""
    pairs = [(w, c) for w, c in zip(with_adversary, without, strict=False) if w is not None and c is not None]
    diffs = [round(c - w, 4) for w, c in pairs]
    return {"per_update": diffs, "final": diffs[-1] if diffs else None,
            "max_abs": max((abs(d) for d in diffs), default=None)}
