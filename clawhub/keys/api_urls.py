from django.urls import path

from clawhub.keys import api

urlpatterns = [
    path("keys/", api.KeyListCreateApi.as_view(), name="api-keys"),
    path("keys/<int:key_id>/", api.KeyDetailApi.as_view(), name="api-key-detail"),
    path("keys/<int:key_id>/revoke/", api.KeyRevokeApi.as_view(), name="api-key-revoke"),
    path("keys/<int:key_id>/rotate/", api.KeyRotateApi.as_view(), name="api-key-rotate"),
    path("keys/<int:key_id>/openclaw/", api.KeyOpenClawApi.as_view(), name="api-key-openclaw"),
    path("groups/<slug:slug>/keys/", api.GroupKeyListApi.as_view(), name="api-group-keys"),
    path("groups/<slug:slug>/keys/<int:key_id>/revoke/", api.GroupKeyRevokeApi.as_view(),
         name="api-group-key-revoke"),
]
