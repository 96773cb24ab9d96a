from django.urls import path

from clawhub.groups.api import one_url
from clawhub.review import api

_feedback = one_url(api.TurnFeedbackDetailApi, api.TurnFeedbackRateApi).as_view()

urlpatterns = [
    path("review/samples/", api.SampleListApi.as_view(), name="api-review-samples"),
    path("review/samples/bulk/", api.SampleBulkApi.as_view(), name="api-review-samples-bulk"),
    path("review/samples/<int:sample_id>/", api.SampleDetailApi.as_view(), name="api-review-sample"),
    path("review/samples/<int:sample_id>/approve/", api.SampleApproveApi.as_view(),
         name="api-review-sample-approve"),
    path("review/samples/<int:sample_id>/reject/", api.SampleRejectApi.as_view(),
         name="api-review-sample-reject"),
    path("review/tenants/<int:tenant_id>/policy/", api.ReviewPolicyApi.as_view(), name="api-review-policy"),
    path("turns/<int:turn_id>/feedback/", _feedback, name="api-turn-feedback"),
]
