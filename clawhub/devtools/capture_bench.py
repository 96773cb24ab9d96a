"""bench_capture: the capture consumer's CPU per stored turn (PostgreSQL + Redis) as a tenant's history grows.

A benchmark, not a test. Records shaped as the gateway hands them off for the fake upstream's replies (reply
token ids and log-probs, the prompt's token ids) are put on a capture stream of the bench's own; then the real
consumer (``clawhub.conversations.capture.consumer.CaptureConsumer`` with ``capture_store``) drains them in
this process, and the CPU this process spent is divided by the turns stored. Nothing else runs in the process
meanwhile, so no idle polling is in the figure; the database server's CPU for the same work is a line of its
own (its backend process, read from /proc).

Workloads (each request one turn):

- ``repeat``: bench_gateway's short body, the same one-message prompt every time (users who repeat a prompt:
  every turn a regenerate of the first, all waiting for a next state);
- ``unique``: bench_gateway's ``openclaw-32k`` body, OpenClaw's system prompt, tools and 40 history messages
  with a new last user message each time;
- ``agent``: OpenClaw-shaped conversations of ``AGENT_TURNS`` turns, each request the previous one's messages,
  its reply and a new user message (every turn links to its parent and becomes its next state).

``--rate`` hands the records off at that rate instead, while the consumer runs its own loop (short reads,
its linger after one, idle reads): the CPU of its thread per stored turn, its mean batch, and how long a
record waited from its hand-off to its batch's commit, once per ``--linger``.

``--history`` seeds each bench tenant, before the run, with that many prior turns written by bulk SQL in the
shape capture leaves them: half repeats of the ``repeat`` prompt in one session, all waiting (as the
``repeat`` workload leaves them), half conversations of 20 linked turns. Each history level gets tenants of
its own, so the levels are measured side by side in one run.
"""

from __future__ import annotations

import json
import os
import time
import uuid
from dataclasses import dataclass
from typing import Any

from clawhub.devtools.gateway_bench import bench_messages
from clawhub.devtools.processes import TICK

AGENT_TURNS = 10  # turns per agent conversation, so the body stays near 32 KB
SEED_SESSION_TURNS = 20
REPLY_WORDS = 20  # the fake upstream's reply to max_tokens=20
WORKLOADS = ("repeat", "unique", "agent")


def _token_id(word: str, position: int) -> int:
    return 1000 + (sum(word.encode()) * 7 + position) % 30000


def _ids(words: list[str], start: int = 0) -> list[int]:
    return [_token_id(w, start + p) for p, w in enumerate(words)]


@dataclass
class Tenant:
    key_id: int
    user_id: int
    tenant_id: int


def bench_tenants(n: int, label: str) -> list[Tenant]:
    from clawhub.accounts.services import user_create
    from clawhub.keys.services import key_create

    out = []
    for i in range(n):
        user = user_create(email=f"bench-capture-{label}-{i}@clawhub.invalid", password=None)
        key, _ = key_create(owner=user, name="bench capture", rpm_limit=None, tpm_limit=None,
                            concurrency_limit=None)
        out.append(Tenant(key_id=key.pk, user_id=user.pk, tenant_id=user.tenant.pk))
    return out


class Records:
    """TurnRecords as the gateway builds them from the fake upstream's non-streamed replies."""

    def __init__(self, t0: float):
        self.t0 = t0
        self.n = 0
        self.repeat_messages = bench_messages("short")[0]
        self.shaped_messages, self.tools = bench_messages("openclaw-32k")
        self.conversations: dict[int, tuple[list[dict], int]] = {}  # tenant id -> (messages so far, turns)

    def reply(self, n: int) -> tuple[str, list[str]]:
        words = [f"w{(n * 7 + i) % 50}" for i in range(REPLY_WORDS)]
        return " ".join(words), words

    def record(self, tenant: Tenant, messages: list[dict], *, tools=None, same_reply: bool = False):
        import orjson

        from clawhub.conversations.capture.records import RawIds, TurnRecord

        self.n += 1
        text, words = self.reply(0 if same_reply else self.n)
        prompt_words = " ".join(m.get("content") or "" for m in messages).split()
        request = {"model": "clawhub-personal", "max_tokens": REPLY_WORDS, "messages": messages,
                   "logprobs": True, "return_token_ids": True}
        if tools:
            request["tools"] = tools
        return TurnRecord(
            request_id=f"bench-{uuid.uuid4().hex}", route="chat", key_id=tenant.key_id,
            user_id=tenant.user_id, tenant_id=tenant.tenant_id, group_id=None, model="clawhub-personal",
            upstream_model=f"t{tenant.tenant_id}-v1", adapter_version_id=None, upstream="http://127.0.0.1:1",
            status="complete", http_status=200, started_at=self.t0 + self.n * 0.001, latency_ms=12.0,
            request=request,
            choices=[{"index": 0, "finish_reason": "length",
                      "message": {"role": "assistant", "content": text}}],
            token_ids=_ids(words, len(prompt_words)), logprobs=[-0.05 * (i + 1) for i in range(len(words))],
            # As the gateway hands them over: vLLM's JSON text, unparsed.
            prompt_token_ids=RawIds(orjson.dumps(_ids(prompt_words))), prompt_tokens=len(prompt_words),
            completion_tokens=len(words),
        )

    def next(self, workload: str, tenant: Tenant):
        if workload == "repeat":
            return self.record(tenant, self.repeat_messages, same_reply=True)
        if workload == "unique":
            last = {"role": "user", "content": f"Next step {self.n}."}
            return self.record(tenant, [*self.shaped_messages, last], tools=self.tools)
        messages, turns = self.conversations.get(tenant.tenant_id, (None, AGENT_TURNS))
        if turns >= AGENT_TURNS:
            opening = {"role": "user", "content": f"Conversation {self.n}: next step."}
            messages, turns = [*self.shaped_messages, opening], 0
        record = self.record(tenant, messages, tools=self.tools)
        reply = record.choices[0]["message"]
        follow = {"role": "user", "content": f"Step {turns + 1} of conversation, go on."}
        self.conversations[tenant.tenant_id] = ([*messages, reply, follow], turns + 1)
        return record


def seed_history(tenants: list[Tenant], turns: int, *, before: float) -> None:
    """``turns`` prior turns per tenant by bulk SQL, as capture leaves them: half repeats of the ``repeat``
    workload's prompt in one session, each a regenerate of the first and all waiting for a next state; half
    conversations of SEED_SESSION_TURNS turns, each the next state of the one before."""
    from django.db import connection

    from clawhub.conversations.identity import message_hashes, reply_message
    from clawhub.conversations.models import Session, Turn

    if turns <= 0:
        return
    records = Records(before)
    sample = records.record(tenants[0], records.repeat_messages, same_reply=True)
    qn = connection.ops.quote_name
    seed = _Seed(
        sessions=qn(Session._meta.db_table), turns=qn(Turn._meta.db_table),
        start=f"to_timestamp({before - turns - 10})", repeats=turns // 2, chained=turns - turns // 2,
        hashes=message_hashes(records.repeat_messages, reply_message(sample.choices)),
        repeat_messages=records.repeat_messages,
    )
    with connection.cursor() as cursor:
        for t in tenants:
            seed.tenant(cursor, t)
        cursor.execute(f"ANALYZE {seed.turns}")
        cursor.execute(f"ANALYZE {seed.sessions}")


@dataclass
class _Seed:
    """seed_history's SQL for one tenant: its sessions, then its repeats and its chained conversations."""

    sessions: str  # the quoted table names
    turns: str
    start: str  # SQL for the time of the first seeded turn
    repeats: int
    chained: int
    hashes: Any  # the repeated prompt's message hashes
    repeat_messages: list[dict]

    def tenant(self, cursor, t: Tenant) -> None:
        from clawhub.conversations.models import Turn

        tag = f"seed-{t.tenant_id}"
        first_session = self._sessions(cursor, t, tag)
        # Turn.api came later: the bench also runs on an older checkout, to compare.
        has_api = any(f.name == "api" for f in Turn._meta.concrete_fields)
        api_column, api_value = ("api, ", "'chat', ") if has_api else ("", "")
        common = (
            api_column + "tenant_id, key_id, user_id, turn_type, route, model, upstream_model, request, "
            "messages_shared, messages_added, prompt_token_ids_shared, response, sampling, "
            "prompt_tokens, completion_tokens, usage_estimated, status, http_status, latency_ms, error, "
            "closed_without_next, continuation_hash_without_retry, link, ended"
        )
        values = (
            api_value + "%s, %s, %s, 'main', 'chat', 'clawhub-personal', '', '{}'::jsonb, 0, '[]', 0, "
            "'[]'::jsonb, '{}'::jsonb, 10, 20, false, 'complete', 200, 12.0, '', false, '', "
        )
        owner = [t.tenant_id, t.key_id, t.user_id]
        if self.repeats:
            self._repeats(cursor, tag, first_session, common, values, owner)
        if self.chained:
            self._chains(cursor, t, tag, common, values, owner)

    def _sessions(self, cursor, t: Tenant, tag: str) -> int:
        """The tenant's sessions: the repeats' (0), then one per chained conversation; returns the first's
        id."""
        n_chains = (self.chained + SEED_SESSION_TURNS - 1) // SEED_SESSION_TURNS
        cursor.execute(
            f"INSERT INTO {self.sessions} (tenant_id, key_id, user_id, external_id, inferred, started_at, "
            f"last_activity_at, close_reason, turn_count) "
            f"SELECT %s, %s, %s, %s || '-' || s, true, {self.start}, {self.start}, '', "
            f"CASE WHEN s = 0 THEN %s ELSE least(%s, %s - (s - 1) * %s) END "
            f"FROM generate_series(0, %s) AS s",
            [t.tenant_id, t.key_id, t.user_id, tag, self.repeats, SEED_SESSION_TURNS, self.chained,
             SEED_SESSION_TURNS, n_chains],
        )
        cursor.execute(f"SELECT id FROM {self.sessions} WHERE tenant_id = %s AND external_id = %s",
                       [t.tenant_id, f"{tag}-0"])
        return cursor.fetchone()[0]

    def _repeats(self, cursor, tag: str, first_session: int, common: str, values: str, owner: list) -> None:
        from clawhub.conversations.storage import dumps

        turn_table, start = self.turns, self.start
        cursor.execute(
            f"INSERT INTO {turn_table} (session_id, \"index\", request_id, created_at, prompt_hash, "
            f"continuation_hash, parent_hash, {common}) "
            f"SELECT %s, i, %s || '-r' || i, {start} + i * interval '1 ms', %s, %s, '', {values} "
            f"CASE WHEN i = 0 THEN '' ELSE 'regenerate' END, 'length' "
            f"FROM generate_series(0, %s) AS i",
            [first_session, tag, self.hashes.prompt, self.hashes.continuation, *owner, self.repeats - 1],
        )
        cursor.execute(
            f"UPDATE {turn_table} SET messages_added = %s WHERE request_id = %s",
            [dumps(self.repeat_messages), f"{tag}-r0"],
        )
        cursor.execute(
            f"UPDATE {turn_table} SET regenerate_of_id = f.id, prompt_base_id = f.id, "
            f"messages_shared = 1 FROM {turn_table} AS f "
            f"WHERE f.request_id = %s AND {turn_table}.session_id = %s AND {turn_table}.index > 0",
            [f"{tag}-r0", first_session],
        )

    def _chains(self, cursor, t: Tenant, tag: str, common: str, values: str, owner: list) -> None:
        turn_table, sessions, start, chained = self.turns, self.sessions, self.start, self.chained
        digest = "encode(sha256(convert_to({}, 'UTF8')), 'hex')"
        cursor.execute(
            f"INSERT INTO {turn_table} (session_id, \"index\", request_id, created_at, prompt_hash, "
            f"continuation_hash, parent_hash, next_state, {common}) "
            f"SELECT s.id, mod(i, {SEED_SESSION_TURNS}), %s || '-c' || i, "
            f"{start} + (%s + i) * interval '1 ms', "
            + digest.format("%s || 'p' || i") + ", " + digest.format("%s || 'c' || i") + ", "
            f"CASE WHEN mod(i, {SEED_SESSION_TURNS}) = 0 THEN '' ELSE "
            + digest.format("%s || 'c' || (i - 1)") + " END, "
            f"CASE WHEN mod(i, {SEED_SESSION_TURNS}) = {SEED_SESSION_TURNS - 1} OR i = %s THEN NULL "
            f"ELSE '[{{\"role\": \"user\", \"content\": \"go on\"}}]'::jsonb END, {values} "
            f"CASE WHEN mod(i, {SEED_SESSION_TURNS}) = 0 THEN '' ELSE 'next' END, 'length' "
            f"FROM generate_series(0, %s) AS i JOIN {sessions} AS s ON s.tenant_id = %s "
            f"AND s.external_id = %s || '-' || (1 + i / {SEED_SESSION_TURNS})",
            [tag, self.repeats, tag, tag, tag, chained - 1, *owner, chained - 1, t.tenant_id, tag],
        )
        # Each turn's parent is the one before it in its session: joined by request id (unique index).
        cursor.execute(
            f"UPDATE {turn_table} AS c SET parent_id = p.id, prompt_base_id = p.id "
            f"FROM generate_series(1, %s) AS i JOIN {turn_table} AS p "
            f"ON p.request_id = %s || '-c' || (i - 1) "
            f"WHERE mod(i, {SEED_SESSION_TURNS}) <> 0 AND c.request_id = %s || '-c' || i",
            [chained - 1, tag, tag],
        )


def _backend_cpu() -> tuple[int, float] | None:
    """(pid, CPU seconds) of this connection's PostgreSQL backend (same machine only), or None."""
    from django.db import connection

    try:
        with connection.cursor() as cursor:
            cursor.execute("SELECT pg_backend_pid()")
            pid = cursor.fetchone()[0]
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return pid, (int(fields[11]) + int(fields[12])) / TICK
    except (OSError, Exception):
        return None


def drain(workload: str, tenants: list[Tenant], *, records: int, batch: int, out_label: dict) -> dict:
    """Hands ``records`` turns of ``workload`` off (round robin over ``tenants``) and times the consumer
    storing them all."""
    import redis
    from django.db import connection

    from clawhub.conversations.capture.compact import forget_recent_prompts
    from clawhub.conversations.capture.consumer import CaptureConsumer
    from clawhub.conversations.capture.handoff import HandoffSettings
    from clawhub.conversations.capture.records import encode

    cfg = HandoffSettings.from_settings(stream=f"bench-capture:{uuid.uuid4().hex}", in_process=False,
                                        batch_records=batch)
    client = redis.Redis.from_url(cfg.redis_url)
    made = Records(time.time())
    pipe = client.pipeline(transaction=False)
    size = 0
    for i in range(records):
        payload = encode(made.next(workload, tenants[i % len(tenants)]))
        size += len(payload)
        pipe.xadd(cfg.stream, {"r": payload})
    pipe.incrby(cfg.bytes_key, size)
    pipe.execute()
    forget_recent_prompts()  # a fresh consumer process
    consumer = CaptureConsumer(cfg, name="bench")
    queries = [0]

    def count(execute, sql, params, many, context):
        queries[0] += 1
        return execute(sql, params, many, context)

    try:
        consumer.source.backlog()  # the group exists before the clock starts
        connection.ensure_connection()
        db0, t0, w0 = _backend_cpu(), time.process_time(), time.perf_counter()
        with connection.execute_wrapper(count):
            while client.xlen(cfg.stream):
                consumer.run_once()
        cpu, wall, db1 = time.process_time() - t0, time.perf_counter() - w0, _backend_cpu()
    finally:
        consumer.close()
        client.delete(cfg.stream, cfg.dead_stream, cfg.bytes_key, cfg.stats_key)
        client.close()
    stored = consumer.stats["stored"]
    batches = max(consumer.stats["batches"], 1)
    return {
        **out_label, "workload": workload, "records": records, "stored": stored,
        "dead_letters": consumer.stats["dead_letters"], "batch": batch, "batches": consumer.stats["batches"],
        "body_bytes": size // max(records, 1),
        "consumer_cpu_ms_per_turn": round(cpu * 1000 / max(stored, 1), 3),
        # None when the consumer reconnected meanwhile (its backend is another process then).
        "db_cpu_ms_per_turn": round((db1[1] - db0[1]) * 1000 / max(stored, 1), 3)
        if db0 and db1 and db0[0] == db1[0] else None,
        "queries_per_batch": round(queries[0] / batches, 1),
        "turns_per_s": round(stored / wall, 1), "wall_s": round(wall, 2),
    }


def paced(workload: str, tenants: list[Tenant], *, rate: float, seconds: float, batch: int, linger_ms: int,
          out_label: dict) -> dict:
    """Hands ``rate`` records a second off for ``seconds`` (round robin over ``tenants``) while the consumer
    runs its own loop in this thread, short reads, lingering and idle reads included: its CPU (this thread's)
    per stored turn, its batches, and how long a record waited from its hand-off to its batch's commit."""
    import threading

    import redis

    from clawhub.conversations.capture.compact import forget_recent_prompts
    from clawhub.conversations.capture.consumer import CaptureConsumer
    from clawhub.conversations.capture.handoff import HandoffSettings
    from clawhub.conversations.capture.records import encode
    from clawhub.conversations.capture.store import capture_store

    cfg = HandoffSettings.from_settings(stream=f"bench-capture:{uuid.uuid4().hex}", in_process=False,
                                        batch_records=batch, batch_linger=linger_ms / 1000)
    client = redis.Redis.from_url(cfg.redis_url)
    made = Records(time.time())
    total = max(1, int(rate * seconds))
    records = [made.next(workload, tenants[i % len(tenants)]) for i in range(total)]
    payloads = [encode(r) for r in records]
    handed: dict[str, float] = {}
    waited: list[float] = []

    def store(batch_records):
        capture_store(batch_records)
        now = time.perf_counter()
        waited.extend(now - handed[r.request_id] for r in batch_records)

    forget_recent_prompts()
    consumer = CaptureConsumer(cfg, store=store, name="bench")
    consumer.source.backlog()  # the group exists before the first record
    stop = threading.Event()

    def hand_off():
        start = time.perf_counter()
        for i, (record, payload) in enumerate(zip(records, payloads, strict=True)):
            delay = start + i / rate - time.perf_counter()
            if delay > 0:
                time.sleep(delay)
            handed[record.request_id] = time.perf_counter()
            client.xadd(cfg.stream, {"r": payload})
            client.incrby(cfg.bytes_key, len(payload))
        while consumer.stats["stored"] + consumer.stats["dead_letters"] < total:
            time.sleep(0.01)
        stop.set()

    producer = threading.Thread(target=hand_off, daemon=True)
    try:
        cpu0 = time.thread_time()
        producer.start()
        consumer.run(stop)
        cpu = time.thread_time() - cpu0
        producer.join()
    finally:
        consumer.close()
        client.delete(cfg.stream, cfg.dead_stream, cfg.bytes_key, cfg.stats_key)
        client.close()
    stored = consumer.stats["stored"]
    waited.sort()
    return {
        **out_label, "workload": workload, "rate": rate, "linger_ms": linger_ms, "stored": stored,
        "batch": batch, "batches": consumer.stats["batches"],
        "mean_batch": round(stored / max(consumer.stats["batches"], 1), 1),
        # Idle reads included: the consumer's whole loop while records came at this rate.
        "consumer_cpu_ms_per_turn": round(cpu * 1000 / max(stored, 1), 3),
        "wait_p50_ms": round(waited[len(waited) // 2] * 1000, 1) if waited else None,
        "wait_max_ms": round(waited[-1] * 1000, 1) if waited else None,
    }


def run(*, records: int, tenants: int, histories: list[int], workloads: list[str], batches: list[int],
        out, rate: float = 0, seconds: float = 20, lingers: list[int] | None = None) -> list[dict]:
    """Drains ``records`` handed off at once per workload and batch size; with ``rate``, hands them off at
    that rate for ``seconds`` instead, once per linger (ms)."""
    from django.db import connection

    label = uuid.uuid4().hex[:8]
    results = []
    load = os.getloadavg()[0]
    for history in histories:
        group = bench_tenants(tenants, f"{label}-h{history}")
        t0 = time.perf_counter()
        seed_history(group, history, before=time.time())
        seeded = round(time.perf_counter() - t0, 1)
        for workload in workloads:
            for batch, linger in [(b, x) for b in batches for x in (lingers or [None])]:
                level = {"history": history, "tenants": tenants}
                if rate:
                    row = paced(workload, group, rate=rate, seconds=seconds, batch=batch,
                                linger_ms=linger or 0, out_label=level)
                else:
                    row = drain(workload, group, records=records, batch=batch, out_label=level)
                row["seed_s"] = seeded
                row["load_1m"] = round(load, 2)
                load = os.getloadavg()[0]
                out.write(json.dumps(row) + "\n")
                out.flush()
                results.append(row)
    connection.close()
    return results
