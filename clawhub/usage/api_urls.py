from django.urls import path

from clawhub.usage import api

urlpatterns = [
    path("usage/", api.UsageApi.as_view(), name="api-usage"),
]
