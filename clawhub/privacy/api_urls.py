from django.urls import path

from clawhub.privacy import api

urlpatterns = [
    path("me/samples/", api.MySampleListApi.as_view(), name="api-me-samples"),
    path("me/samples/<int:sample_id>/", api.MySampleDeleteApi.as_view(), name="api-me-sample"),
    path("me/privacy/", api.PrivacyApi.as_view(), name="api-me-privacy"),
    path("me/keys/<int:key_id>/training/", api.MyKeyTrainingApi.as_view(), name="api-me-key-training"),
    path("me/export/", api.ExportApi.as_view(), name="api-me-export"),
    path("me/delete/", api.AccountDeleteApi.as_view(), name="api-me-delete"),
]
