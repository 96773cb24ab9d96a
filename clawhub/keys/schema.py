"""Tells the OpenAPI schema how API-key authentication works (loaded from KeysConfig.ready)."""

from drf_spectacular.extensions import OpenApiAuthenticationExtension


class ApiKeyAuthenticationScheme(OpenApiAuthenticationExtension):
    target_class = "clawhub.keys.authentication.ApiKeyAuthentication"
    name = "ApiKey"

    def get_security_definition(self, auto_schema):
        return {"type": "http", "scheme": "bearer", "bearerFormat": "chk_…",
                "description": "An API key, as `Authorization: Bearer chk_…` (or the `X-API-Key` header)."}
