"""Forwarding an admitted /v1 request to an upstream: the body it is sent with, the choice of upstream (the
next one when one cannot be reached), the request itself (the adapter loaded first, a stale pooled connection
retried once) and the answer given back: one JSON reply, or the SSE stream relayed chunk by chunk
(clawhub.gateway.proxy). A part of ``Gateway`` (clawhub.gateway.app), which admits the request first.
"""

import logging

import httpx
import orjson

from clawhub.conversations.capture.records import TurnRecord
from clawhub.core.metrics import UPSTREAM_ERRORS
from clawhub.gateway import feedback, limits, messages, responses, tool_calls
from clawhub.gateway.bodies import encode_body
from clawhub.gateway.errors import no_upstream, normalise_upstream_error, upstream_refused, upstream_timeout
from clawhub.gateway.h1client import UpstreamResponse
from clawhub.gateway.http import send_json
from clawhub.gateway.identity import Identity
from clawhub.gateway.proxy import Wants, parse_reply, relay_stream, rewrite_response
from clawhub.gateway.upstreams import ActiveAdapter, Upstream
from workers.upstream_errors import body_shape

logger = logging.getLogger("clawhub.gateway")

# Failing to reach an upstream before it answered anything: safe to try the next one.
CONNECT_ERRORS = (httpx.ConnectError, httpx.ConnectTimeout, httpx.RemoteProtocolError, httpx.ReadError,
                  httpx.WriteError)
# What a pooled connection the upstream closed while it sat idle looks like when it is reused: the request
# went nowhere. Retried once on a fresh connection, without holding it against the upstream.
STALE_ERRORS = (httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError)
TO_CLIENT = {"messages": messages.to_message, "responses": responses.to_response}


class Forwarding:
    """The forwarding half of ``Gateway``: uses its ``pool``, ``upstream`` and ``fresh_upstream`` clients."""

    def _upstream_body(self, body: dict, identity: Identity, chat: bool, wants: Wants) -> dict:
        upstream = dict(body)
        if chat and identity.turn_type != "side":
            # Training needs what was sampled: ask for it, and strip it from the reply if the client did not.
            if not wants.logprobs:
                upstream["logprobs"] = True
                if upstream.get("top_logprobs") is None:
                    upstream["top_logprobs"] = 0
            upstream["return_token_ids"] = True
        if body.get("stream") is True:
            options = dict(body.get("stream_options") or {})
            # A Messages or Responses stream always ends with its usage (message_delta, response.completed).
            wants.usage = bool(options.get("include_usage")) or wants.api != "openai"
            options["include_usage"] = True
            upstream["stream_options"] = options
        else:
            upstream.pop("stream_options", None)  # vLLM refuses stream_options without stream
        return upstream

    async def _forward(self, scope, send, body: dict, record: TurnRecord, identity: Identity,
                       adapter: ActiveAdapter | None, chat: bool, tenant_id: int,
                       api: str = "openai") -> None:
        id_route = record.route if api == "openai" else api
        wants = Wants(model=body["model"],
                      logprobs=bool(body.get("logprobs")) if chat else body.get("logprobs") is not None,
                      token_ids=bool(body.get("return_token_ids")), usage=False,
                      completion_id=feedback.completion_id_for(request_id=record.request_id, route=id_route),
                      declared_tools=tool_calls.declared_tools(body) if chat else None, api=api)
        path = scope["path"] if api == "openai" else "/v1/chat/completions"
        upstream_body = self._upstream_body(body, identity, chat, wants)
        requested = limits.requested_output(upstream_body)
        name = adapter.name if adapter else None
        candidates = self.pool.candidates(name, tenant_id)
        for up in candidates:
            upstream_body["model"] = name or up.base_model
            record.upstream, record.upstream_model = up.url, upstream_body["model"]
            if requested is not None:
                upstream_body[requested[0]] = requested[1]  # each upstream clamps to its own context
            forwarded = limits.clamp_output(upstream_body, up.max_model_len)
            self.pool.begin(up, name)  # in flight from dispatch: routing sees it for the whole generation
            response = None
            try:
                try:
                    response = await self._open(up, adapter, path, encode_body(upstream_body))
                    if response.status_code == 400 and requested is not None and forwarded is None:
                        # The upstream did not list its context length: its refusal names it. Learn, retry.
                        learned = limits.too_many_output_tokens(await response.aread())
                        if learned is not None:
                            await response.aclose()
                            up.max_model_len = learned
                            forwarded = limits.clamp_output(upstream_body, learned)
                            response = await self._open(up, adapter, path, encode_body(upstream_body))
                except CONNECT_ERRORS:
                    UPSTREAM_ERRORS.labels(kind="connect").inc()
                    self.pool.mark_unhealthy(up)
                    continue
                except httpx.TimeoutException:
                    UPSTREAM_ERRORS.labels(kind="timeout").inc()
                    raise upstream_timeout() from None
                await self._respond(send, response, wants, record, chat)
            finally:
                self.pool.end(up, name)
                if response is not None:
                    await response.aclose()
                record.clamped_max_tokens = limits.applied_cap(
                    requested=requested[1] if requested else None, forwarded=forwarded,
                    max_model_len=up.max_model_len, prompt_tokens=record.prompt_tokens)
            return
        UPSTREAM_ERRORS.labels(kind="no_upstream").inc()
        raise no_upstream()

    async def _open(self, up: Upstream, adapter: ActiveAdapter | None, path: str, payload: bytes):
        """Sends the request and returns the upstream's response once its headers arrived."""
        reloaded = retried = False
        while True:
            if adapter is not None:
                await self.pool.ensure_loaded(up, adapter)
            client = self.fresh_upstream if retried else self.upstream
            try:
                response = await client.post(up.url + path, payload, up.headers)
            except STALE_ERRORS:
                if retried:
                    raise
                # A pooled connection the upstream had closed: once more on a fresh one (the pool drops
                # the dead connection), and the upstream stays healthy.
                retried = True
                UPSTREAM_ERRORS.labels(kind="stale_connection").inc()
                continue
            if response.status_code == 404 and adapter is not None and not reloaded:
                # vLLM restarted, or the drain sweep unloaded an old version: load it again, once.
                await response.aclose()
                await self.pool.forget(up, adapter.name)
                reloaded = True
                continue
            return response

    async def _respond(self, send, response: UpstreamResponse, wants: Wants, record: TurnRecord,
                       chat: bool) -> None:
        if response.status_code != 200:
            try:
                raw = await response.aread()
            except httpx.HTTPError:
                raw = b""
            error = (limits.context_length_error(raw) if response.status_code == 400 else None) \
                or normalise_upstream_error(response.status_code, raw, client_model=wants.model)
            UPSTREAM_ERRORS.labels(kind="http_5xx" if response.status_code >= 500 else "http_4xx").inc()
            # The body's shape only: vLLM's messages quote the request, which is a user's conversation.
            logger.warning("upstream %s answered %s: %s", record.upstream, response.status_code,
                           body_shape(response) if raw else "no body")
            raise error
        if not record.stream:
            try:
                raw = await response.aread()
            except httpx.TimeoutException:
                UPSTREAM_ERRORS.labels(kind="timeout").inc()
                raise upstream_timeout() from None
            except httpx.HTTPError:
                UPSTREAM_ERRORS.labels(kind="cut").inc()
                raise upstream_refused("The model server stopped in the middle of the response.") from None
            try:
                data, prompt_ids = parse_reply(raw, chat)
            except orjson.JSONDecodeError:
                UPSTREAM_ERRORS.labels(kind="protocol").inc()
                raise upstream_refused("The model server sent a malformed response.") from None
            rewrite_response(data, wants, record, prompt_ids)
            if wants.api != "openai":
                data = TO_CLIENT[wants.api](data, wants.model)
            record.status = "complete"
            await send_json(send, 200, orjson.dumps(data))
            return
        await relay_stream(response, send, wants, record, chat)
