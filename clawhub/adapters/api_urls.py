from django.urls import path

from clawhub.adapters import api

urlpatterns = [
    path(
        "adapters/tenants/<int:tenant_id>/versions/",
        api.VersionListApi.as_view(),
        name="api-adapter-versions",
    ),
    path("adapters/tenants/<int:tenant_id>/pin/", api.PinApi.as_view(), name="api-adapter-pin"),
    path("adapters/tenants/<int:tenant_id>/unpin/", api.UnpinApi.as_view(), name="api-adapter-unpin"),
    path("adapters/versions/<int:version_id>/", api.VersionDetailApi.as_view(), name="api-adapter-version"),
    path(
        "adapters/versions/<int:version_id>/rollback/",
        api.VersionRollbackApi.as_view(),
        name="api-adapter-version-rollback",
    ),
]
