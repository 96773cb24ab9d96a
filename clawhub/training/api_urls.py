from django.urls import path

from clawhub.training import api

urlpatterns = [
    path("training/tenants/<int:tenant_id>/runs/", api.RunListApi.as_view(), name="api-training-runs"),
    path(
        "training/tenants/<int:tenant_id>/runs/start/",
        api.RunStartApi.as_view(),
        name="api-training-run-start",
    ),
    path(
        "training/tenants/<int:tenant_id>/settings/", api.SettingsApi.as_view(), name="api-training-settings"
    ),
    path("training/runs/<int:run_id>/", api.RunDetailApi.as_view(), name="api-training-run"),
    path("training/runs/<int:run_id>/cancel/", api.RunCancelApi.as_view(), name="api-training-run-cancel"),
]
