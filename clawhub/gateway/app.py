"""The /v1 gateway: a raw ASGI app, so the hot path skips Django's request and middleware stack entirely.

Per request: a cached key lookup, one Redis round trip for quotas (which also tells whether the cached key is
still current), the adapter mapping, and the upstream call over a pooled connection. Everything that writes to
the database happens later, on the writer thread.
"""

import asyncio
import itertools
import logging
import os
import time
from dataclasses import dataclass
from time import perf_counter

import httpx
import orjson

from clawhub.conversations.capture.records import TurnRecord
from clawhub.conversations.capture.writer import CaptureWriter
from clawhub.core.logging import clean_request_id, new_request_id, reset_request_id, set_request_id
from clawhub.core.metrics import (
    CAPTURE_FAILURES,
    GATEWAY_REQUEST_DURATION,
    GATEWAY_REQUESTS,
    UPSTREAM_ERRORS,
    model_label,
)
from clawhub.gateway import feedback, limits, messages, responses
from clawhub.gateway.auth import KeyCache, KeyInfo, presented_secret
from clawhub.gateway.bodies import check_model, parse_json, parse_request
from clawhub.gateway.config import GatewayConfig
from clawhub.gateway.dbreads import CachedLoader, DbRunner
from clawhub.gateway.errors import (
    GatewayError,
    invalid_key,
    model_not_found,
    no_upstream,
    normalise_upstream_error,
    upstream_refused,
    upstream_timeout,
)
from clawhub.gateway.forwarding import CONNECT_ERRORS, Forwarding
from clawhub.gateway.h1client import UpstreamClient
from clawhub.gateway.http import ClientGone, read_body, send_json
from clawhub.gateway.identity import extract_identity
from clawhub.gateway.meters import ServedRequests
from clawhub.gateway.proxy import watch_disconnect
from clawhub.gateway.quotas import AdapterGeneration, AdapterMoved, LocalLimiter, RedisLimiter, reservation
from clawhub.gateway.transport import UpstreamTransport
from clawhub.gateway.upstreams import (
    ActiveAdapter,
    SharedResidency,
    TenantAdapter,
    UpstreamPool,
    shared_tenant_adapter_blocking,
    tenant_adapter_blocking,
    version_adapter_blocking,
)
from clawhub.tenants import naming

logger = logging.getLogger("clawhub.gateway")

ROUTES = {"/v1/chat/completions": "chat", "/v1/completions": "completions", messages.PATH: "messages",
          responses.PATH: "responses"}
# The other APIs served through the chat route: each module translates a request to chat (``to_chat``), reads
# its client's session id (``client_session_id``) and side requests (``side_kind``) and gives the reply back
# in its own shape.
TRANSLATED = {"messages": messages, "responses": responses}
# Routes whose clients read errors in Anthropic's shape rather than OpenAI's.
ANTHROPIC_ROUTES = frozenset({"messages", "count_tokens"})
ADMIT_LOOKUPS = 3  # fresh lookups of a key whose generation moved before admission gives up (503)
VERSION_CACHE = 2.0  # seconds a named adapter version (``<id>:v<N>``) is cached


@dataclass(slots=True)
class Served:
    """What ``_http`` needs to count a request that no TurnRecord counts (the writer counts the others)."""

    # "chat" | "completions" | "messages" | "responses" | "count_tokens" | "models"; None for unknown routes
    # (never counted)
    route: str | None
    model: str | None = None
    recorded: bool = False  # a TurnRecord went to the writer, which updates the metrics from it


class Gateway(Forwarding):
    def __init__(self, config: GatewayConfig | None = None, *, store=None):
        self.config = config or GatewayConfig.from_settings()
        self._store = store
        self._started = False
        self._start_lock: asyncio.Lock | None = None

    # --- lifecycle -----------------------------------------------------------------------------------------
    async def startup(self) -> None:
        if self._start_lock is None:
            self._start_lock = asyncio.Lock()
        async with self._start_lock:
            if self._started:
                return
            cfg = self.config
            httpx_logger = logging.getLogger("httpx")
            if httpx_logger.level == logging.NOTSET:
                # httpx logs every upstream request at INFO; on the hot path that is CPU spent for nothing.
                httpx_logger.setLevel(logging.WARNING)
            # Idle connections are dropped before the upstream would drop them (uvicorn, under vLLM, closes
            # them after 5 s), so a reused one is rarely stale; forwarding.STALE_ERRORS covers the race left.
            self.upstream = UpstreamClient(keepalive=cfg.upstream_keepalive,
                                           connect_timeout=cfg.connect_timeout, read_timeout=cfg.read_timeout)
            # The one retry after a stale connection goes out on a connection of its own, never a pooled one.
            self.fresh_upstream = UpstreamClient(keepalive=0, connect_timeout=cfg.connect_timeout,
                                                 read_timeout=cfg.read_timeout)
            # Health checks, adapter loads and /tokenize: rare, and in httpx like the workers' admin calls.
            timeout = httpx.Timeout(cfg.read_timeout, connect=cfg.connect_timeout)
            self.client = httpx.AsyncClient(timeout=timeout,
                                            transport=UpstreamTransport(keepalive=cfg.upstream_keepalive))
            self._ids = itertools.count()
            self._id_prefix = f"{os.urandom(4).hex()}{os.getpid():x}-"  # unique across workers and restarts
            self.db = DbRunner()
            self.writer = CaptureWriter(store=self._store, maxsize=cfg.capture_queue_size,
                                        observer=ServedRequests())
            self.writer.start()
            self.keys = KeyCache(self.db, ttl=cfg.key_cache_seconds)
            self.adapters = CachedLoader(self._load_adapter, ttl=cfg.adapter_cache_seconds, what="adapter",
                                         shared=self._shared_adapter)
            # A named version's row only gains its weights, so it is cached briefly, without a generation.
            self.versions = CachedLoader(self._load_version, what="adapter",
                                         ttl=min(cfg.adapter_cache_seconds, VERSION_CACHE))
            if cfg.redis_url:
                self.limiter = RedisLimiter(cfg.redis_url, cfg.group_limits, lease_seconds=cfg.lease_seconds)
                shared = SharedResidency(cfg.redis_url, timeout=cfg.redis_timeout)
            else:
                self.limiter = LocalLimiter(cfg.group_limits, lease_seconds=cfg.lease_seconds)
                shared = None
            await self.limiter.start()
            self.pool = UpstreamPool(cfg.upstreams, self.client, health_interval=cfg.health_interval,
                                     writer=self.writer, shared=shared)
            await self.pool.start()
            self._started = True

    async def shutdown(self) -> None:
        if not self._started:
            return
        self._started = False
        # Each part closes on its own: one that raises must neither keep the writer from handing off the turns
        # it holds (they were served) nor the other parts from closing.
        closes = [("upstream pool", self.pool.stop),
                  *(("upstream client", client.aclose)
                    for client in (self.upstream, self.fresh_upstream, self.client)),
                  ("quota limiter", self.limiter.close),
                  ("capture writer", lambda: asyncio.to_thread(self.writer.stop)),  # flushes queued turns
                  ("database runner", lambda: asyncio.to_thread(self.db.close))]
        for name, close in closes:
            try:
                await close()
            except Exception:
                logger.exception("gateway shutdown: closing the %s failed", name)

    async def _load_adapter(self, tenant_id: int) -> TenantAdapter:
        return await self.db.run(tenant_adapter_blocking, tenant_id)

    @staticmethod
    async def _shared_adapter(tenant_id: int) -> TenantAdapter | None:
        # Not on the read threads: those may all be waiting on the database that is away.
        return await asyncio.to_thread(shared_tenant_adapter_blocking, tenant_id)

    async def _load_version(self, tenant_version: tuple[int, int]) -> ActiveAdapter | None:
        return await self.db.run(version_adapter_blocking, *tenant_version)

    async def _adapter_for(self, info: KeyInfo, model: str) -> tuple[ActiveAdapter | None,
                                                                      AdapterGeneration | None]:
        """The adapter a request for ``model`` (already checked against the key) is served with: none for the
        base, the tenant's active version for its model id (with the generation admission checks it by),
        the named one for ``<id>:v<N>``."""
        if model == naming.BASE_MODEL_ID:
            return None, None
        _, version = naming.split_version(model)
        if version is None:
            current = await self.adapters.get(info.tenant_id)
            return current.adapter, current.generation
        adapter = await self.versions.get((info.tenant_id, version))
        if adapter is None:
            raise model_not_found(model)
        return adapter, None

    # --- ASGI ----------------------------------------------------------------------------------------------
    async def __call__(self, scope, receive, send) -> None:
        kind = scope["type"]
        if kind == "http":
            if not self._started:
                await self.startup()  # served without lifespan (tests, some servers)
            await self._http(scope, receive, send)
        elif kind == "lifespan":
            await self._lifespan(receive, send)

    async def _lifespan(self, receive, send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                try:
                    await self.startup()
                except Exception as exc:
                    logger.exception("gateway startup failed")
                    await send({"type": "lifespan.startup.failed", "message": str(exc)})
                    return
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                await self.shutdown()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _http(self, scope, receive, send) -> None:
        t0 = perf_counter()
        path, method = scope["path"], scope["method"]
        headers = dict(scope["headers"])
        given = headers.get(b"x-request-id")
        trace_id = (clean_request_id(given.decode("latin-1")) if given else None) or new_request_id()
        id_header = (b"x-request-id", trace_id.encode())
        token = set_request_id(trace_id)  # every log line of this request carries it
        response_started = [False]

        async def tracked_send(message) -> None:
            if message["type"] == "http.response.start":
                response_started[0] = True
                message["headers"] = [*message["headers"], id_header]
            await send(message)

        route = ROUTES.get(path) or ("count_tokens" if path == messages.COUNT_TOKENS_PATH else None)
        is_models = route is None and (path == "/v1/models" or path.startswith("/v1/models/"))
        served = Served("models" if is_models else route)
        error_body = messages.error_body if route in ANTHROPIC_ROUTES else GatewayError.body
        status = 200
        try:
            if route is not None:
                if method != "POST":
                    raise GatewayError(405, f"Use POST for {path}.", code="method_not_allowed")
                if route == "count_tokens":
                    await self._count_tokens(headers, receive, tracked_send, served)
                else:
                    await self._completion(scope, receive, tracked_send, route, headers, served, trace_id)
            elif is_models:
                if method != "GET":
                    raise GatewayError(405, f"Use GET for {path}.", code="method_not_allowed")
                served.model = path[len("/v1/models/"):] or None
                await self._models(headers, tracked_send, served.model)
            elif path == feedback.PATH:
                body = await feedback.answer(self, headers, method, lambda n: read_body(receive, headers, n))
                await send_json(tracked_send, 200, body)
            else:
                raise GatewayError(404, f"Unknown route {method} {path}.", code="unknown_url")
        except GatewayError as err:
            status = err.status
            if not response_started[0]:
                await send_json(tracked_send, err.status, error_body(err), err.headers())
        except ClientGone:
            status = 499
        except Exception:
            status = 500
            logger.exception("unexpected error serving %s", path)
            if not response_started[0]:
                err = GatewayError(500, "Internal gateway error.", type="api_error", code="internal_error")
                await send_json(tracked_send, 500, error_body(err))
        finally:
            reset_request_id(token)
            if served.route is not None and not served.recorded:
                # Refused before a turn existed (auth, bad input, quota) or /v1/models: rare or cheap
                # enough to count here, on the event loop.
                model = model_label(served.model)
                GATEWAY_REQUESTS.labels(route=served.route, model=model, status=str(status)).inc()
                GATEWAY_REQUEST_DURATION.labels(route=served.route, model=model).observe(perf_counter() - t0)

    async def _authenticate(self, headers: dict[bytes, bytes], *, check_generation: bool = True):
        """The presented key's cached lookup. ``check_generation``: compare the generation it was looked up
        under with the current one first (one read of it); completions leave it to admission, which reads it
        in the same round trip as the quotas."""
        secret = presented_secret(headers)
        if not secret:
            raise invalid_key("Missing API key: send 'Authorization: Bearer <key>'.")
        digest, entry = await self.keys.lookup(secret)
        if entry.info is None:
            raise invalid_key()
        if check_generation and await self.limiter.generation_moved(entry.info, entry.generation):
            # Revoked, rotated or changed since it was cached: look it up again.
            self.keys.forget(digest)
            digest, entry = await self.keys.lookup(secret)
            if entry.info is None:
                raise invalid_key()
        return secret, digest, entry

    async def _models(self, headers: dict[bytes, bytes], send, model_id: str | None) -> None:
        _, _, entry = await self._authenticate(headers)
        models = [{"id": m, "object": "model", "created": 0, "owned_by": "clawhub"}
                  for m in entry.info.models()]
        if model_id is None:
            await send_json(send, 200, orjson.dumps({"object": "list", "data": models}))
            return
        for model in models:
            if model["id"] == model_id:
                await send_json(send, 200, orjson.dumps(model))
                return
        raise model_not_found(model_id)

    async def _count_tokens(self, headers: dict[bytes, bytes], receive, send, served: Served) -> None:
        """POST /v1/messages/count_tokens: the prompt a Messages request would send, rendered by vLLM's
        /tokenize exactly as the chat route renders it. Nothing is sampled, but rendering a long prompt costs
        the upstream CPU: it is admitted like any request (the key's and group's requests per minute and
        concurrency; no tokens reserved or counted) and refused with a 429 past them."""
        secret, digest, entry = await self._authenticate(headers, check_generation=False)
        raw = await read_body(receive, headers, self.config.max_body_bytes)
        chat = messages.to_chat(parse_json(raw), count_only=True)
        served.model = chat["model"]
        check_model(entry.info, chat["model"])
        request_id = f"{self._id_prefix}{next(self._ids):x}"
        info, _ = await self._admit(secret, digest, entry, request_id, chat["model"], reserve=0, adapter=None)
        try:
            count = await self._tokenize(chat, info.tenant_id, served)
        finally:
            try:
                await self.limiter.release(info, request_id, 0)
            except Exception:
                logger.exception("quota release failed")
        await send_json(send, 200, orjson.dumps({"input_tokens": count}))

    async def _tokenize(self, chat: dict, tenant_id: int, served: Served) -> int:
        """The number of tokens the chat request ``chat`` renders to, from the first upstream that answers."""
        body = {"messages": chat["messages"], "add_generation_prompt": True}
        if "tools" in chat:
            body["tools"] = chat["tools"]
        for up in self.pool.candidates(None, tenant_id):
            body["model"] = up.base_model  # the adapter shares the base model's tokenizer
            try:
                response = await self.client.post(up.url + "/tokenize", content=orjson.dumps(body),
                                                  headers=up.headers)
            except CONNECT_ERRORS:
                UPSTREAM_ERRORS.labels(kind="connect").inc()
                self.pool.mark_unhealthy(up)
                continue
            except httpx.TimeoutException:
                UPSTREAM_ERRORS.labels(kind="timeout").inc()
                raise upstream_timeout() from None
            if response.status_code != 200:
                raise normalise_upstream_error(response.status_code, response.content,
                                               client_model=served.model)
            try:
                return orjson.loads(response.content)["count"]
            except (orjson.JSONDecodeError, KeyError, TypeError):
                raise upstream_refused("The model server sent a malformed response.") from None
        UPSTREAM_ERRORS.labels(kind="no_upstream").inc()
        raise no_upstream()

    async def _admit(self, secret: str, digest: str, entry, request_id: str, model: str, *, reserve: int,
                     adapter: ActiveAdapter | None, adapter_generation: AdapterGeneration | None = None,
                     ) -> tuple[KeyInfo, ActiveAdapter | None]:
        """Admission under the key's and the tenant adapter's current generations: the key, and the adapter
        the request is served with (read again if it changed since it was cached)."""
        for _ in range(ADMIT_LOOKUPS):
            try:
                admitted, generation = await self._admit_once(
                    entry.info, request_id, entry.generation, reserve, adapter.name if adapter else None,
                    adapter_generation)
            except AdapterMoved:
                # The tenant's active adapter changed (a promotion, a rollback): read it again.
                self.adapters.forget(entry.info.tenant_id)
                adapter, adapter_generation = await self._adapter_for(entry.info, model)
                continue
            if admitted:
                if generation is not None:  # admission read the generations: what is cached is current
                    if entry.generation is not None and generation == entry.generation:
                        self.keys.confirm(digest)
                    if adapter_generation is not None:
                        self.adapters.confirm(entry.info.tenant_id)
                return entry.info, adapter
            # The key was revoked, rotated or changed since it was cached: look it up again.
            self.keys.forget(digest)
            _, entry = await self.keys.lookup(secret)
            if entry.info is None:
                raise invalid_key()
            check_model(entry.info, model)
        # Changed again after each fresh lookup: somebody is changing it right now.
        raise GatewayError(503, "This API key is being changed; try again.", type="api_error",
                           code="service_unavailable", retry_after=1)

    async def _admit_once(self, info: KeyInfo, request_id: str, generation: str | None, reserve: int,
                          adapter: str | None, adapter_generation: AdapterGeneration | None):
        try:
            return await self.limiter.admit(info, request_id, generation, reserve=reserve, adapter=adapter,
                                            adapter_generation=adapter_generation)
        except (GatewayError, AdapterMoved):
            raise
        except Exception:
            # Redis unreachable: serving goes on without quotas rather than failing every agent.
            logger.exception("quota check failed; admitting without limits")
            return True, None  # nothing checked

    async def _completion(self, scope, receive, send, route: str, headers: dict[bytes, bytes], served: Served,
                          trace_id: str) -> None:
        """One completion, from the key to the capture hand-off. Long on purpose: it is the request's whole
        path in the order it runs (key, body, translation, adapter, admission, record, forward, hand-off,
        release), and the try/finally that frees what admission took must enclose everything after it."""
        started_wall, t0 = time.time(), perf_counter()
        secret, digest, entry = await self._authenticate(headers, check_generation=False)
        raw = await read_body(receive, headers, self.config.max_body_bytes)
        api = route if route in TRANSLATED else "openai"
        if api != "openai":
            # Served as the chat request it translates to; the turn is a chat turn like any other.
            given = parse_json(raw)
            translated = TRANSLATED[api]
            body, route = translated.to_chat(given), "chat"
            identity = extract_identity(headers, body)
            if identity.session_id is None:
                identity.session_id = translated.client_session_id(headers, given)
            if identity.turn_type is None:
                identity.side_kind = translated.side_kind(given)
                if identity.side_kind is not None:
                    identity.turn_type = "side"
        else:
            body = parse_request(raw, route == "chat")
            identity = extract_identity(headers, body)
        if entry.info.playground:
            identity.turn_type = "playground"  # whatever the request says: trained on only once rated
        chat = route == "chat"
        model = served.model = body["model"]
        check_model(entry.info, model)
        adapter, adapter_generation = await self._adapter_for(entry.info, model)
        request_id = f"{self._id_prefix}{next(self._ids):x}"
        requested = limits.requested_output(body)
        context = self.pool.max_model_len()
        output = requested[1] if requested else context
        reserve = reservation(body, len(raw), min(output, context) if output and context else output)
        info, adapter = await self._admit(secret, digest, entry, request_id, model, reserve=reserve,
                                          adapter=adapter, adapter_generation=adapter_generation)

        record = TurnRecord(
            request_id=request_id, route=route, key_id=info.key_id, user_id=info.user_id,
            tenant_id=info.tenant_id, group_id=info.group_id, model=model, upstream_model="",
            adapter_version_id=adapter.id if adapter else None, upstream="", status="failed", http_status=200,
            started_at=started_wall, latency_ms=0.0, stream=body.get("stream") is True,
            session_id=identity.session_id, turn_type=identity.turn_type, session_done=identity.session_done,
            request=body, trace_id=trace_id, api="" if api == "openai" else api,
        )
        served.recorded = True
        # Everything after admission runs under the finally below, which frees what admission took (the key's,
        # group's and adapter's leases) however the request ends.
        try:
            self.writer.begin(request_id)  # in flight until the record is handed off (counted after a crash)
            # From here on a client that goes away cancels the request, streamed or not: the upstream
            # connection is closed (vLLM aborts the generation) and the concurrency lease is freed at once.
            task = asyncio.current_task()
            state = {"done": False, "gone": False}
            watcher = asyncio.create_task(watch_disconnect(receive, task, state))
            try:
                await self._forward(scope, send, body, record, identity, adapter, chat, info.tenant_id, api)
            except asyncio.CancelledError:
                if not state["gone"]:
                    raise
                task.uncancel()
                if record.status != "complete":  # not a client that left after the last byte
                    record.http_status = 499  # nginx's "client closed request"
                    record.status = "cut" if record.stream else "failed"
                    record.error = "client disconnected"
            finally:
                state["done"] = True
                watcher.cancel()
        except GatewayError as err:
            record.http_status, record.error = err.status, err.message
            raise
        except BaseException as exc:
            record.http_status, record.error = 500, type(exc).__name__
            raise
        finally:
            record.latency_ms = (perf_counter() - t0) * 1000
            # Handed off first: nothing awaited before it can cancel it away (the release awaits Redis).
            try:
                self.writer.submit(record)
            except Exception:
                # The turn is lost (counted); the leases below must not be as well.
                CAPTURE_FAILURES.labels(reason="handoff_error").inc()
                logger.exception("capture hand-off of %s failed", request_id)
            try:
                await self.limiter.release(info, request_id, record.prompt_tokens + record.completion_tokens)
            except Exception:
                logger.exception("quota release failed")
