from django.contrib import admin
from django.urls import include, path
from drf_spectacular.views import SpectacularAPIView, SpectacularRedocView

api_patterns = [
    path("", include("clawhub.accounts.api_urls")),
    path("", include("clawhub.groups.api_urls")),
    path("", include("clawhub.keys.api_urls")),
    path("", include("clawhub.adapters.api_urls")),
    path("", include("clawhub.conversations.api_urls")),
    path("", include("clawhub.feedback.api_urls")),
    path("", include("clawhub.usage.api_urls")),
    path("", include("clawhub.review.api_urls")),
    path("", include("clawhub.privacy.api_urls")),
    path("", include("clawhub.training.api_urls")),
    path("schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("docs/", SpectacularRedocView.as_view(url_name="api-schema"), name="api-docs"),
]

# Under /api/ even an unknown URL answers with the API's JSON error body.
handler400 = "clawhub.core.api.bad_request"
handler404 = "clawhub.core.api.not_found"

urlpatterns = [
    path("", include("clawhub.core.urls")),  # /healthz, /readyz, /metrics
    path("admin/", admin.site.urls),
    path("api/", include(api_patterns)),
    path("", include("clawhub.accounts.urls")),
    path("", include("clawhub.groups.urls")),
    path("", include("clawhub.keys.urls")),
    path("", include("clawhub.adapters.urls")),
    path("", include("clawhub.web.conversations_urls")),
    path("", include("clawhub.usage.urls")),
    path("", include("clawhub.review.urls")),
    path("", include("clawhub.privacy.urls")),
    path("", include("clawhub.training.urls")),
    path("", include("clawhub.web.urls")),
    path("", include("clawhub.web.onboarding_urls")),
]
