"""Rendering of errors for the web API, and request helpers every API view uses."""

from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.http import Http404, HttpRequest, HttpResponse, JsonResponse
from django.views.defaults import bad_request as default_bad_request
from django.views.defaults import page_not_found
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, inline_serializer
from rest_framework import exceptions as drf_exceptions
from rest_framework import serializers
from rest_framework.pagination import LimitOffsetPagination, PageNumberPagination
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from clawhub.core.exceptions import ClawHubError, RateLimited, ValidationFailed

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


def _invalid_message(fields: object) -> str:
    """'Invalid input.' followed by the first field's first error, so a client that shows only the message
    still learns what to change (data.fields holds them all)."""
    if isinstance(fields, dict):
        for name, errors in fields.items():
            first = errors[0] if isinstance(errors, list) and errors else errors
            if isinstance(first, str):
                return f"Invalid input. {name}: {first}"
    return "Invalid input."


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
        response.data = error_body("invalid", _invalid_message(response.data), {"fields": response.data})
    elif isinstance(exc, drf_exceptions.APIException):
        detail = exc.detail if isinstance(exc.detail, str) else str(exc.detail)
        response.data = error_body(exc.get_codes() if isinstance(exc.get_codes(), str) else exc.default_code,
                                   detail)
    elif isinstance(exc, Http404):  # e.g. an unknown ?format=
        response.data = error_body("not_found", "Not found.")
    elif isinstance(exc, DjangoPermissionDenied):
        response.data = error_body("permission_denied", "You do not have permission to do this.")
    return response


def page_of(name: str, item: serializers.Serializer) -> serializers.Serializer:
    """The OpenAPI description of a page of ``item`` as DRF's paginators render it."""
    return inline_serializer(name=name, fields={
        "count": serializers.IntegerField(), "next": serializers.URLField(allow_null=True),
        "previous": serializers.URLField(allow_null=True), "results": item})


# The query parameters of ``Pagination`` (a page past the last is 404) and of ``LimitOffset``.
PAGE_PARAMETERS = [
    OpenApiParameter("page", {"type": "integer", "minimum": 1},
                     description="1-based page number (404 past the last page)."),
    OpenApiParameter("page_size", {"type": "integer", "minimum": 1},
                     description="Items per page (the view's default and maximum apply)."),
]


def _check_counts(request, minimums: dict[str, int]) -> None:
    """Each named query parameter, when given, is one integer of at least its minimum, or the request is 400.
    DRF's paginators read anything else as "use the default": a value that is not a count, the last of
    repeated ones, and nothing at all of ``page[x]=1`` (an object, in OpenAPI's deepObject style)."""
    params = request.query_params
    for name, least in minimums.items():
        values = params.getlist(name)
        as_object = any(key.startswith(f"{name}[") for key in params)
        if as_object or len(values) > 1 or (values and not (
                values[0].isascii() and values[0].isdigit() and int(values[0]) >= least)):
            raise ValidationFailed(f"'{name}' must be one integer of at least {least}.", field=name,
                                   fields={name: [f"An integer of at least {least} is required."]})


class Pagination(PageNumberPagination):
    """DRF's page numbers, with ``page`` and ``page_size`` positive integers or refused (400): DRF would
    serve the default page size for ``page_size=null`` and read ``page=0`` as "no such page"."""

    page_size_query_param = "page_size"

    def paginate_queryset(self, queryset, request, view=None):
        _check_counts(request, {self.page_query_param: 1, self.page_size_query_param: 1})
        return super().paginate_queryset(queryset, request, view)


class QueryChoiceField(serializers.ChoiceField):
    """A query parameter with a fixed set of values: given empty (``?state=``) it is refused like any value
    outside the set. DRF's HTML-form rule would read an empty optional field as not given."""

    def get_value(self, dictionary):
        if dictionary.get(self.field_name) == "":
            return ""
        return super().get_value(dictionary)


LIMIT_OFFSET_PARAMETERS = [
    OpenApiParameter("limit", {"type": "integer", "minimum": 1},
                     description="Items to return (the view's default and maximum apply)."),
    OpenApiParameter("offset", {"type": "integer", "minimum": 0}, description="Items to skip."),
]


class LimitOffset(LimitOffsetPagination):
    """DRF's limit and offset, each an integer (limit at least 1) or refused (400), like ``Pagination``."""

    def paginate_queryset(self, queryset, request, view=None):
        _check_counts(request, {self.limit_query_param: 1, self.offset_query_param: 0})
        return super().paginate_queryset(queryset, request, view)


def not_found(request: HttpRequest, exception=None) -> HttpResponse:
    """Django's 404 for a URL no route matches: under /api/ the API's JSON error body, else the HTML page."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("not_found", "No such API endpoint or object."), status=404)
    return page_not_found(request, exception)


def bad_request(request: HttpRequest, exception=None) -> HttpResponse:
    """Django's 400 for a request it refuses before any view (too many fields, a body over
    DATA_UPLOAD_MAX_MEMORY_SIZE): under /api/ the API's JSON error body."""
    if request.path.startswith("/api/"):
        return JsonResponse(error_body("bad_request", "The request is malformed or too large."), status=400)
    return default_bad_request(request, exception)


def client_ip(request: HttpRequest) -> str | None:
    """The client's address. Behind a proxy, the operator's proxy sets REMOTE_ADDR via the ASGI server."""
    return request.META.get("REMOTE_ADDR") or None
