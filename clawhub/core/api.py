"""Rendering of errors for the web API, and request helpers every API view uses."""

from django.http import HttpRequest
from drf_spectacular.utils import OpenApiResponse
from rest_framework import exceptions as drf_exceptions
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from clawhub.core.exceptions import ClawHubError, RateLimited

# How ``exception_handler`` renders every error, for the OpenAPI description.
_ERROR_BODY = "Error body: {\"error\": {\"code\", \"message\", \"data\"}}."


def error_body(code: str, message: str, data: dict | None = None) -> dict:
    body = {"error": {"code": code, "message": message}}
    if data:
        body["error"]["data"] = data
    return body


def openapi_error(description: str) -> OpenApiResponse:
    """An error response for the OpenAPI description: when it happens, and the body every error has."""
    return OpenApiResponse(description=f"{description} {_ERROR_BODY}")


def exception_handler(exc, context):
    """Renders ClawHubError and DRF's own errors as ``{"error": {"code", "message", "data"}}``."""
    if isinstance(exc, ClawHubError):
        response = Response(error_body(exc.code, exc.message, exc.data), status=exc.status)
        if isinstance(exc, RateLimited):
            response["Retry-After"] = str(exc.retry_after)
        return response
    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    if isinstance(exc, drf_exceptions.ValidationError):
        response.data = error_body("invalid", "Invalid input.", {"fields": response.data})
    elif isinstance(exc, drf_exceptions.APIException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        response.data = error_body(exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code,
                                   detail)
    return response


def client_ip(request: HttpRequest) -> str | None:
    """The client's address. Behind a proxy, the operator's proxy sets REMOTE_ADDR via the ASGI server."""
    return request.META.get("REMOTE_ADDR") or None
