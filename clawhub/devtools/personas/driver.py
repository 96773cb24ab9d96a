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

Beside this module: ``config`` (BenchConfig), ``client`` (the clients of /api/ and /v1), ``tracks`` (a tenant
under test and its records, shared with the in-process track), ``reviewer`` (step 3) and ``measure`` (step
4's figures).
"""

from __future__ import annotations

import json
import logging
import random
import secrets
import sys
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import httpx

from clawhub.devtools.personas import personas as P
from clawhub.devtools.personas.client import Api, BenchError, openai_client, temperature
from clawhub.devtools.personas.config import BenchConfig
from clawhub.devtools.personas.measure import (
    capability,
    feedback_stages,
    feedback_times,
    judge_agreement,
    measure,
)
from clawhub.devtools.personas.reviewer import review
from clawhub.devtools.personas.tracks import (
    Member,
    Track,
    UpdateRecord,
    adversary_shift,
    compliance_png,
    request_seed,
    write_results,
)

logger = logging.getLogger("clawhub.devtools.personas")


# --- the benchmark ------------------------------------------------------------------------------------------


class Bench:
    def __init__(self, config: BenchConfig, *, echo: Callable[[str], None] = print,
                 log: Callable[[str], None] | None = None, transport: httpx.BaseTransport | None = None,
                 client_factory: Callable[[str, str], Any] | None = None):
        """``transport`` (for /api/) and ``client_factory(base_url, secret)`` (for /v1) stand in for the
        network in tests; by default the bench talks to ``config.base_url`` with httpx and ``openai``."""
        self.config = config
        self.transport = transport
        self.client_factory = client_factory or openai_client
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
            **temperature(self.config.chat_temperature),
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
            review(track)
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
            sent_at = feedback_times(track, run.get("sample_ids") or [])
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
            record.compliance = measure(track, config=cfg, tag=self.tag)
            if cfg.capability:
                record.capability = capability(track, config=cfg, tag=self.tag)
            record.wall_s = time.monotonic() - began
            return record
        except TimeoutError as exc:
            track.error = f"timed out waiting for {exc} after {cfg.update_timeout:.0f} s"
            return record

    def measure_base(self, track: Track) -> None:
        """The track's base figures: compliance, the capability guard, and the prompt-only baseline."""
        track.base_compliance = measure(track, config=self.config, tag=self.tag)
        if self.config.capability:
            track.base_capability = capability(track, config=self.config, tag=self.tag)
        if self.config.prompt_only:
            track.prompt_only_compliance = measure(track, config=self.config, tag=self.tag,
                                                   system=track.persona.preference)

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
                track.judge_agreement = judge_agreement(track)
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
