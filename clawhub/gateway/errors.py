"""OpenAI-shaped errors for /v1, and the normalisation of the many shapes vLLM answers with."""

import re

import orjson


class GatewayError(Exception):
    """An error a /v1 client sees: ``{"error": {"message", "type", "param", "code"}}`` with an HTTP status."""

    def __init__(self, status: int, message: str, *, type: str = "invalid_request_error",
                 code: str | None = None, param: str | None = None, retry_after: int | None = None):
        super().__init__(message)
        self.status, self.message, self.type, self.code, self.param = status, message, type, code, param
        self.retry_after = retry_after
        # For upstream failures, the UPSTREAM_ERRORS kind (connect, timeout, http_5xx, ...); "cut" if unset.
        self.upstream_kind = "cut"

    def payload(self) -> dict:
        return {"error": {"message": self.message, "type": self.type, "param": self.param, "code": self.code}}

    def body(self) -> bytes:
        return orjson.dumps(self.payload())

    def headers(self) -> list[tuple[bytes, bytes]]:
        if self.retry_after is None:
            return []
        return [(b"retry-after", str(self.retry_after).encode())]


def bad_request(message: str, *, param: str | None = None, code: str | None = None) -> GatewayError:
    return GatewayError(400, message, param=param, code=code)


def invalid_key(message: str = "Invalid, revoked or expired API key.") -> GatewayError:
    return GatewayError(401, message, code="invalid_api_key")


def model_not_allowed(model: str) -> GatewayError:
    return GatewayError(403, f"This key may not use the model `{model}`.", type="permission_error",
                        code="model_not_allowed", param="model")


def model_not_found(model: str) -> GatewayError:
    return GatewayError(404, f"The model `{model}` does not exist or you do not have access to it.",
                        code="model_not_found", param="model")


def too_large(limit: int) -> GatewayError:
    return GatewayError(413, f"Request body is larger than {limit} bytes.", code="request_too_large")


def rate_limited(message: str, retry_after: int) -> GatewayError:
    return GatewayError(429, message, type="rate_limit_exceeded", code="rate_limit_exceeded",
                        retry_after=max(1, retry_after))


def upstream_refused(message: str = "The model server refused the request.") -> GatewayError:
    return GatewayError(502, message, type="api_error", code="upstream_error")


def no_upstream() -> GatewayError:
    return GatewayError(503, "No model server is available right now; retry shortly.", type="api_error",
                        code="service_unavailable", retry_after=5)


def upstream_timeout() -> GatewayError:
    return GatewayError(504, "The model server did not answer in time.", type="api_error",
                        code="upstream_timeout")


# What must never reach a client: other tenants' adapter names and the server's file paths.
_ADAPTER_NAME = re.compile(r"\bt\d+-v\d+\b")
_PATH = re.compile(r"(?:/[\w.~+-]+){2,}/?")
# vLLM 0.32 says "Valid aliases: …", older versions "Valid models: …"; either lists every tenant's adapter.
_VALID_MODELS = ("Valid models:", "Valid model:", "Valid aliases:")
# vLLM's messages may echo what the client sent: only this much of one is read (and 2,000 characters shown).
_MESSAGE_READ = 4000


def _without_model_list(message: str) -> str:
    cuts = [at for at in (message.find(lead) for lead in _VALID_MODELS) if at != -1]
    return message[:min(cuts)].rstrip() if cuts else message


def _sanitise(message: str, client_model: str | None) -> str:
    message = _without_model_list(message[:_MESSAGE_READ])
    message = _ADAPTER_NAME.sub(client_model or "<model>", message)
    return _PATH.sub("<path>", message)[:2000]


def normalise_upstream_error(status: int, raw: bytes, *, client_model: str | None) -> GatewayError:
    """Turns any error vLLM sends (``{"error":{…}}`` with odd types, flat ``{"object":"error"}``,
    ``{"detail":…}``, ``{"error":"Unauthorized"}``, or not JSON at all) into the OpenAI shape."""
    try:
        data = orjson.loads(raw) if raw else None
    except orjson.JSONDecodeError:
        data = None
    message, param = "", None
    if isinstance(data, dict):
        inner = data.get("error")
        if isinstance(inner, dict):
            message, param = str(inner.get("message") or ""), inner.get("param")
        elif isinstance(inner, str):
            message = inner
        elif data.get("object") == "error":
            message, param = str(data.get("message") or ""), data.get("param")
        elif "detail" in data:
            detail = data["detail"]
            message = detail if isinstance(detail, str) else "The model server could not parse the request."
    param = param if isinstance(param, str) else None
    if status in (401, 403):
        # The client's key was already accepted; this is the gateway's own credential at the upstream.
        return upstream_refused("The model server rejected the gateway's credentials.")
    if status == 404:
        return model_not_found(client_model or "")
    if status == 413:
        return GatewayError(413, "Request body is too large for the model server.", code="request_too_large")
    if status == 429:
        return GatewayError(429, "The model server is overloaded; retry shortly.", type="rate_limit_exceeded",
                            code="rate_limit_exceeded", retry_after=1)
    if 400 <= status < 500:
        return GatewayError(400, _sanitise(message, client_model) or "Bad request.",
                            param=param, code="invalid_request")
    return upstream_refused()
