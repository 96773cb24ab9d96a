"""The web API's settings: Django REST framework's defaults (how /api/ authenticates, authorizes, parses and
answers errors) and the OpenAPI schema drf-spectacular draws from it. Constants, read from no environment;
``base`` takes them in."""

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": [
        "clawhub.keys.authentication.ApiKeyAuthentication",
        "rest_framework.authentication.SessionAuthentication",
    ],
    # An API key may call only the endpoints its scopes cover (clawhub/keys/scopes.py); sessions pass, with
    # CSRF enforced on writes by SessionAuthentication.
    "DEFAULT_PERMISSION_CLASSES": [
        "rest_framework.permissions.IsAuthenticated",
        "clawhub.keys.scopes.KeyScopePermission",
    ],
    # DRF's three, with JSON nested too deeply for Python's parser a 400 (clawhub.core.parsers).
    "DEFAULT_PARSER_CLASSES": [
        "clawhub.core.parsers.JSONParser",
        "rest_framework.parsers.FormParser",
        "rest_framework.parsers.MultiPartParser",
    ],
    "DEFAULT_SCHEMA_CLASS": "clawhub.core.openapi.ClawHubAutoSchema",
    "EXCEPTION_HANDLER": "clawhub.core.api.exception_handler",
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
}
SPECTACULAR_SETTINGS = {
    "TITLE": "ClawHub API",
    "DESCRIPTION": "Accounts, groups, API keys and the rest of ClawHub's web API. Every error has the body "
                   "{\"error\": {\"code\", \"message\", \"data\"}}; text fields refuse NUL characters.",
    "VERSION": "0.1.0",
    "SERVE_INCLUDE_SCHEMA": False,
    # /api/docs/ loads Redoc from our static files (templates/drf_spectacular/redoc.html drops its web fonts).
    "REDOC_DIST": "SIDECAR",
    # A PATCH body is described by its serializer as it validates it: fields it requires stay required.
    "COMPONENT_SPLIT_PATCH": False,
    "POSTPROCESSING_HOOKS": [
        "drf_spectacular.hooks.postprocess_schema_enums",
        "clawhub.core.openapi.document_errors",
        "clawhub.core.openapi.add_links",
    ],
}
