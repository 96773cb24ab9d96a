"""bench_gateway: the same bounded load straight at a fake upstream, through ClawHub, and through LiteLLM.

A benchmark, not a test. The gateway runs as in production (uvicorn workers, the configured PostgreSQL and
Redis, auth + quotas + metering + capture on). CPU per request is read from /proc for the gateway's process
tree: unlike requests/s it barely moves with the noise of a shared machine.

``--body openclaw-32k`` / ``openclaw-90k`` sends OpenClaw-shaped bodies (a long system prompt with every
section, its 12 tools, 40 or 160 history messages; about 32 KB or 90 KB), each request ending with a user
message of its own. Where the gateway hands turns off to the capture consumer
(clawhub.conversations.capture.consumer), the bench runs ``manage.py capture_consumer`` beside it and reports
the consumer's CPU per request and its lag: the largest backlog seen during the run and how long the backlog
took to drain after the last response. Per stored turn (the consumer's counter), it prints the gateway's CPU,
the consumer's CPU beyond what it spends idle over the same wall time (read over IDLE_WINDOW seconds of an
empty log just before the run), and the two together; ``manage.py bench_capture`` measures the consumer alone,
as a tenant's history grows.

As in production, ClawHub's load comes from ``--tenants`` tenants (200 by default), each with its own key and
active adapter, used in turn, so key and adapter caches miss as often as real agents' turns make them. The
gateway's CPU is read after the capture log drained, so the work it defers (its XADD sender, its metrics
and registry thread) is in the figure; the consumer's CPU is a line of its own. ``--profile PATH`` runs the
gateway's event loop under cProfile (thread CPU time) and prints where it went.

``--apis`` adds the same turns through ClawHub's other APIs, which it serves through its chat route:
Anthropic's Messages API (``clawhub-messages``, what Claude Code sends) and OpenAI's Responses API
(``clawhub-responses``, what Codex CLI sends), each row with its CPU per request next to chat completions'
(``cpu_over_chat``).
"""

import asyncio
import json
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import httpx
from django.core.management import get_commands

from clawhub.devtools.litellm_baseline import (
    LITELLM_MODE,
    LITELLM_REQUIREMENT,
    ensure_litellm,
    litellm_version,
    start_litellm,
)
from clawhub.devtools.processes import free_port, spawn, stop, tree_cpu_seconds, wait_http

ROOT = Path(__file__).resolve().parents[2]


BODIES = {"short": 0, "openclaw-32k": 40, "openclaw-90k": 160}  # history messages
_HISTORY_CHARS = {40: 420, 160: 440}  # per message, so the whole body lands near 32 KB / 90 KB


_SECTION = ("## {name}\n\nRead the workspace before you change it. Prefer one precise tool call to "
            "many broad ones, and read each result before the next step. Say what you did in a few plain "
            "sentences; never invent a file, a command or a result. When a tool fails, fix the cause and try "
            "once more.\n")
_PARAMETERS = {"type": "object", "required": ["path"], "properties": {
    "path": {"type": "string", "description": "relative path"}, "content": {"type": "string"},
    "timeout": {"type": "integer"}}}
_TOOLS = [{"type": "function", "function": {"name": name, "description": f"{name}: {detail}.",
                                            "parameters": _PARAMETERS}}
          for name, detail in (("read", "a file's text"), ("write", "replace a file"),
                               ("exec", "run a command"))]


def bench_messages(body: str) -> tuple[list[dict], list[dict]]:
    """The messages and tools every request of this body shape sends (its last user message is added per
    request): OpenClaw's shape, with its long system prompt, tools and history, in made-up words."""
    history = BODIES[body]
    if not history:
        return [{"role": "user", "content": "Say something short about benchmarks."}], []
    system = "You are a personal coding agent in the user's workspace.\n\n" + "".join(
        _SECTION.format(name=f"Section {i}") for i in range(45))
    messages = [{"role": "system", "content": system},
                {"role": "user", "content": "[Tue 2026-12-01 08:27 UTC] Hello, are you there?\n\n"
                 "Runtime: agent=main | session=agent:main:main | sessionId=bench"}]
    filler = ("I looked at the file and the change is small: the loop reads the config once, and the test "
              "covers the empty case. Next I will run the suite and report what fails. ") * 4
    size = _HISTORY_CHARS[history]
    for i in range(history):
        role = "assistant" if i % 2 else "user"
        messages.append({"role": role, "content": f"[{i}] " + filler[:size]})
    return messages, _TOOLS


# The APIs ClawHub serves, each at its own path with its own body for the same turn.
API_PATHS = {"chat": "/chat/completions", "messages": "/messages", "responses": "/responses"}


def api_body(api: str, *, model: str, max_tokens: int, stream: bool, messages: list[dict],
             tools: list[dict]) -> dict:
    """One turn's request body in ``api``'s shape (the bench's messages are plain strings)."""
    if api == "chat":
        body = {"model": model, "max_tokens": max_tokens, "stream": stream, "messages": messages}
        return {**body, "tools": tools} if tools else body
    system = "\n".join(m["content"] for m in messages if m["role"] == "system")
    turns = [m for m in messages if m["role"] != "system"]
    functions = [tool["function"] for tool in tools]
    if api == "messages":
        body = {"model": model, "max_tokens": max_tokens, "stream": stream, "messages": turns}
        if tools:
            body["tools"] = [{"name": f["name"], "description": f.get("description", ""),
                              "input_schema": f["parameters"]} for f in functions]
        return {**body, "system": system} if system else body
    body = {"model": model, "max_output_tokens": max_tokens, "stream": stream, "store": False, "input": turns}
    if tools:
        body["tools"] = [{"type": "function", **f} for f in functions]
    return {**body, "instructions": system} if system else body


def capture_backlog() -> int:
    """What the capture consumer has yet to store (stream entries, or spool bytes); 0 without a log."""
    try:
        from clawhub.conversations.capture.handoff import handoff_state
    except ImportError:
        return 0
    state = handoff_state()
    return int(state.get("backlog", state.get("backlog_bytes", 0)) or 0)


@dataclass
class Target:
    name: str
    base_url: str  # .../v1
    api_key: str
    model: str
    pid: int | None  # the process tree whose CPU is charged to this target
    keys: list[str] | None = None  # one per tenant, used in turn (ClawHub); None: api_key for every request
    api: str = "chat"  # which of API_PATHS it is sent as


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))] if ordered else 0.0


class _Load:
    """The requests drive() sends to a target (its bodies, keys in turn) and what it measures of them."""

    def __init__(self, target: Target, *, stream: bool, max_tokens: int, body_shape: str) -> None:
        self.target, self.stream, self.max_tokens = target, stream, max_tokens
        self.messages, self.tools = bench_messages(body_shape)
        self.body = self.turn(self.messages)
        self.keys = target.keys or [target.api_key]
        self.key_turn = iter(range(10**9))
        self.url = f"{target.base_url}{API_PATHS[target.api]}"
        self.counter = iter(range(10**9))
        self.shaped = body_shape != "short"
        self.reset()

    def turn(self, history: list[dict]) -> dict:
        return api_body(self.target.api, model=self.target.model, max_tokens=self.max_tokens,
                        stream=self.stream, messages=history, tools=self.tools)

    def reset(self) -> None:
        self.latencies: list[float] = []
        self.ttfts: list[float] = []
        self.failures = 0
        self.statuses: dict[str, int] = {}

    async def one(self, client: httpx.AsyncClient) -> None:
        if self.shaped:  # every request a turn of its own, as an agent's would be
            last = {"role": "user", "content": f"Next step {next(self.counter)}."}
            self.body = self.turn([*self.messages, last])
        headers = {"Authorization": f"Bearer {self.keys[next(self.key_turn) % len(self.keys)]}"}
        t0 = time.perf_counter()
        try:
            status = await self._send(client, headers, t0)
        except httpx.HTTPError as exc:  # a failure of this request, counted: not the end of the benchmark
            status = f"client {type(exc).__name__}"
        self.latencies.append((time.perf_counter() - t0) * 1000)
        if status != 200:
            self.failures += 1
            self.statuses[str(status)] = self.statuses.get(str(status), 0) + 1

    async def _send(self, client: httpx.AsyncClient, headers: dict, t0: float) -> int:
        if not self.stream:
            return (await client.post(self.url, json=self.body, headers=headers)).status_code
        async with client.stream("POST", self.url, json=self.body, headers=headers) as response:
            first = None
            async for _ in response.aiter_raw():
                if first is None:
                    first = time.perf_counter()
        if first is not None:
            self.ttfts.append((first - t0) * 1000)
        return response.status_code


async def drive(target: Target, *, stream: bool, requests: int, concurrency: int, max_tokens: int,
                body_shape: str = "short", consumer_pid: int | None = None) -> dict:
    load = _Load(target, stream=stream, max_tokens=max_tokens, body_shape=body_shape)
    # Idle connections dropped after 4 s, before uvicorn (every target here) closes them at 5 s: waiting for
    # the capture log to drain between runs once let the driver reuse a closed one (httpx.ReadError).
    limits = httpx.Limits(max_connections=concurrency, max_keepalive_connections=concurrency,
                          keepalive_expiry=4.0)
    async with httpx.AsyncClient(timeout=120, limits=limits) as client:
        # Warm connections, and load every tenant's adapter once (as a day of traffic would have): the
        # measured run still misses the key and adapter caches as often as real agents' turns do.
        for _ in range(max(min(50, requests), len(load.keys))):
            await load.one(client)
        load.reset()
        remaining = [requests]

        async def worker() -> None:
            while remaining[0] > 0:
                remaining[0] -= 1
                await load.one(client)

        track = consumer_pid is not None and target.name.startswith("clawhub")
        idle = {}
        if track:  # start from an empty log, so the drain time is this run's own
            await _drained(timeout=600)
            idle = await _idle_rates({"gateway": target.pid, "consumer": consumer_pid})
            stored0 = await asyncio.to_thread(_stored_count)
        cpu0 = tree_cpu_seconds(target.pid) if target.pid else 0.0
        ccpu0 = tree_cpu_seconds(consumer_pid) if track else 0.0
        peak = [0]

        async def sample() -> None:
            while True:
                peak[0] = max(peak[0], await asyncio.to_thread(capture_backlog))
                await asyncio.sleep(0.5)

        sampler = asyncio.create_task(sample()) if track else None
        t0 = time.perf_counter()
        await asyncio.gather(*(worker() for _ in range(concurrency)))
        elapsed = time.perf_counter() - t0
        capture = {}
        if track:
            sampler.cancel()
            drain = await _drained(timeout=600)
            ccpu = tree_cpu_seconds(consumer_pid) - ccpu0
            span = time.perf_counter() - t0
        # Read after the drain: the gateway's own deferred work (its XADD sender, registry and metrics
        # thread) is in the figure too.
        cpu = (tree_cpu_seconds(target.pid) - cpu0) if target.pid else 0.0
        if track:
            stored = await asyncio.to_thread(_stored_count) - stored0
            capture = _capture_figures(requests=requests, stored=stored, cpu=cpu, consumer_cpu=ccpu,
                                       span=span, idle=idle, backlog_max=peak[0], drain=drain)
    return {
        "mode": target.name, "api": target.api, "stream": stream, "requests": requests,
        "concurrency": concurrency,
        "failures": load.failures, **({"failed_statuses": load.statuses} if load.statuses else {}),
        "rps": round(requests / elapsed, 1),
        "p50_ms": round(percentile(load.latencies, 0.5), 2),
        "p99_ms": round(percentile(load.latencies, 0.99), 2),
        "ttft_p50_ms": round(percentile(load.ttfts, 0.5), 2) if load.ttfts else None,
        "cpu_ms_per_request": round(cpu * 1000 / requests, 3) if target.pid else None,
        "body": body_shape, "body_bytes": len(json.dumps(load.body)), "tenants": len(load.keys), **capture,
    }


def _capture_figures(*, requests: int, stored: int, cpu: float, consumer_cpu: float, span: float,
                     idle: dict[str, float], backlog_max: int, drain: float) -> dict:
    """What capture cost a run: the gateway's and the consumer's CPU per stored turn and per request."""
    # The consumer polls while the log is empty: what it burns idle over the same wall time is not the
    # turns' cost, so it is taken off (and shown as a rate of its own).
    busy = max(0.0, consumer_cpu - idle["consumer"] * span)
    per_turn = 1000 / max(stored, 1)
    return {"capture_backlog_max": backlog_max, "capture_drain_s": round(drain, 2),
            "turns_stored": stored,
            "consumer_cpu_ms_per_request": round(consumer_cpu * 1000 / requests, 3),
            "consumer_idle_cpu_ms_per_s": round(idle["consumer"] * 1000, 3),
            "gateway_idle_cpu_ms_per_s": round(idle["gateway"] * 1000, 3),
            "gateway_cpu_ms_per_turn": round(cpu * per_turn, 3),
            "consumer_cpu_ms_per_turn": round(busy * per_turn, 3),
            "gateway_plus_consumer_cpu_ms_per_turn": round((cpu + busy) * per_turn, 3),
            "gateway_plus_consumer_cpu_ms_per_request": round((cpu + consumer_cpu) * 1000 / requests, 3)}


IDLE_WINDOW = 3.0  # seconds of an empty log over which the processes' idle CPU is read


async def _idle_rates(pids: dict[str, int]) -> dict[str, float]:
    """CPU seconds per second each process tree spends while nothing is sent and the log is empty."""
    before = {name: tree_cpu_seconds(pid) for name, pid in pids.items()}
    t0 = time.perf_counter()
    await asyncio.sleep(IDLE_WINDOW)
    elapsed = time.perf_counter() - t0
    return {name: (tree_cpu_seconds(pid) - before[name]) / elapsed for name, pid in pids.items()}


def _stored_count() -> int:
    """Turns the capture consumers have stored so far (their shared counter)."""
    from clawhub.conversations.capture.handoff import handoff_state

    return int(handoff_state().get("stored", 0) or 0)


async def _drained(timeout: float) -> float:
    """Seconds until the capture log is empty."""
    t0 = time.perf_counter()
    while time.perf_counter() - t0 < timeout and await asyncio.to_thread(capture_backlog) > 0:
        await asyncio.sleep(0.1)
    return time.perf_counter() - t0


def bench_identities(tenants: int) -> tuple[list[str], str]:
    """``tenants`` bench users, each with a fresh key and an active adapter of its own, so the full hot path
    (key lookup, adapter mapping, adapter residency) runs for many tenants, as in production."""
    from clawhub.accounts.models import User
    from clawhub.accounts.services import user_create
    from clawhub.adapters.models import AdapterVersion
    from clawhub.keys.services import key_create

    secrets = []
    stamp = int(time.time())
    for i in range(tenants):
        email = f"bench-gateway-{i}@clawhub.invalid"
        user = User.objects.filter(email=email).first() or user_create(email=email, password=None)
        # No limits: the benchmark measures the gateway, not a new key's default quota.
        _, secret = key_create(owner=user, name=f"bench {stamp}", rpm_limit=None, tpm_limit=None,
                               concurrency_limit=None)
        AdapterVersion.objects.get_or_create(tenant=user.tenant, version=1, defaults={
            "state": AdapterVersion.State.ACTIVE, "artifact_path": f"/srv/adapters/bench/{i}/v1"})
        secrets.append(secret)
    return secrets, "clawhub-personal"


def run(*, requests: int, concurrency: int, workers: int, max_tokens: int, litellm: bool, out,
        body: str = "short", modes: tuple[bool, ...] = (False, True), tenants: int = 200,
        profile: str | None = None, apis: tuple[str, ...] = ("chat",)) -> list[dict]:
    """``profile``: a path; the gateway's event loop runs under cProfile and its stats are written there
    (one worker only), with the top entries by own time printed at the end."""
    import logging

    logging.getLogger("httpx").setLevel(logging.WARNING)  # the driver's own requests are not news
    fake_port, gw_port, llm_port = free_port(), free_port(), free_port()
    upstream = f"http://127.0.0.1:{fake_port}"
    processes = []
    try:
        fake = spawn([sys.executable, "-m", "uvicorn", "clawhub.devtools.fake_upstream:app", "--port",
                      str(fake_port), "--no-access-log", "--log-level", "warning"], {"FAKE_LOAD_DELAY": "0"})
        processes.append(fake)
        wait_http(f"{upstream}/health")
        secrets, model = bench_identities(tenants)
        serve = [sys.executable, "-m", "uvicorn", "clawhub.asgi:application", "--port", str(gw_port),
                 "--workers", str(workers), "--no-access-log", "--log-level", "warning"]
        if profile:
            serve = [sys.executable, "-m", "clawhub.devtools.profiled", profile, *serve[3:]]
        gateway = spawn(serve, {"CLAWHUB_UPSTREAMS": json.dumps([{"url": upstream, "base_model": "tiny",
                                                                 "max_adapters": 8}])})
        processes.append(gateway)
        consumer_pid = None
        # Asked of Django, not of a path: the command moved with capture once; older checkouts have none.
        if "capture_consumer" in get_commands():
            consumer = spawn([sys.executable, str(ROOT / "manage.py"), "capture_consumer"])
            processes.append(consumer)
            consumer_pid = consumer.pid
        wait_http(f"http://127.0.0.1:{gw_port}/v1/models")
        targets = [Target("direct", f"{upstream}/v1", "none", "tiny", fake.pid),
                   Target("clawhub", f"http://127.0.0.1:{gw_port}/v1", secrets[0], model, gateway.pid,
                          keys=secrets)]
        targets += [Target(f"clawhub-{api}", f"http://127.0.0.1:{gw_port}/v1", secrets[0], model, gateway.pid,
                           keys=secrets, api=api) for api in apis if api != "chat"]
        if litellm:
            exe = ensure_litellm()
            if exe is None:
                out.write(json.dumps({"mode": "litellm", "skipped": f"could not install {LITELLM_REQUIREMENT}"
                                      " (set LITELLM_BIN to an installed litellm)"}) + "\n")
            else:
                process, key = start_litellm(exe, upstream, llm_port, workers)
                processes.append(process)
                out.write(json.dumps({"mode": "litellm", "setup": LITELLM_MODE, "executable": exe,
                                      "version": litellm_version(exe)}) + "\n")
                out.flush()
                targets.append(Target("litellm", f"http://127.0.0.1:{llm_port}/v1", key, "tiny", process.pid))
        results = []
        for stream in modes:
            by_mode = {}
            for target in targets:
                row = asyncio.run(drive(target, stream=stream, requests=requests, concurrency=concurrency,
                                        max_tokens=max_tokens, body_shape=body, consumer_pid=consumer_pid))
                c1 = asyncio.run(drive(target, stream=stream, requests=min(300, requests), concurrency=1,
                                       max_tokens=max_tokens, body_shape=body))
                row["c1_p50_ms"] = c1["p50_ms"]
                row["workers"] = workers
                by_mode[target.name] = row
            claw = by_mode["clawhub"]
            claw["clawhub_over_direct_rps"] = round(claw["rps"] / by_mode["direct"]["rps"], 3)
            claw["added_c1_p50_ms"] = round(claw["c1_p50_ms"] - by_mode["direct"]["c1_p50_ms"], 2)
            if "litellm" in by_mode:
                claw["clawhub_over_litellm_rps"] = round(claw["rps"] / by_mode["litellm"]["rps"], 2)
                lite = by_mode["litellm"]["cpu_ms_per_request"]
                if lite:
                    claw["litellm_over_clawhub_cpu"] = round(lite / claw["cpu_ms_per_request"], 1)
            for row in by_mode.values():
                if row["mode"].startswith("clawhub-") and claw["cpu_ms_per_request"]:
                    row["cpu_over_chat"] = round(row["cpu_ms_per_request"] / claw["cpu_ms_per_request"], 2)
            for row in by_mode.values():
                out.write(json.dumps(row) + "\n")
                out.flush()
            results.extend(by_mode.values())
    finally:
        for process in reversed(processes):
            stop(process)
    if profile:
        out.write(profile_summary(profile))
    return results


def profile_summary(path: str, top: int = 25) -> str:
    import io
    import pstats

    if not os.path.exists(path):
        return f"bench_gateway: no profile at {path}\n"
    buffer = io.StringIO()
    stats = pstats.Stats(path, stream=buffer)
    stats.sort_stats("tottime").print_stats(top)
    return buffer.getvalue()
