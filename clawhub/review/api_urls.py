from django.urls import path

from clawhub.review import api

urlpatterns = [
    path("review/samples/", api.SampleListApi.as_view(), name="api-review-samples"),
    path("review/samples/bulk/", api.SampleBulkApi.as_view(), name="api-review-samples-bulk"),
    path("review/samples/<int:sample_id>/", api.SampleDetailApi.as_view(), name="api-review-sample"),
    path("review/samples/<int:sample_id>/approve/", api.SampleApproveApi.as_view(),
         name="api-review-sample-approve"),
    path("review/samples/<int:sample_id>/reject/", api.SampleRejectApi.as_view(),
         name="api-review-sample-reject"),
    path("review/tenants/<int:tenant_id>/policy/", api.ReviewPolicyApi.as_view(), name="api-review-policy"),
    path("me/samples/", api.MySampleListApi.as_view(), name="api-me-samples"),
    path("me/samples/<int:sample_id>/", api.MySampleDeleteApi.as_view(), name="api-me-sample"),
    path("me/privacy/", api.PrivacyApi.as_view(), name="api-me-privacy"),
    path("me/keys/<int:key_id>/training/", api.MyKeyTrainingApi.as_view(), name="api-me-key-training"),
    path("me/export/", api.ExportApi.as_view(), name="api-me-export"),
    path("me/delete/", api.AccountDeleteApi.as_view(), name="api-me-delete"),
]
