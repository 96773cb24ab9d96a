from django.urls import path

from clawhub.review import views

urlpatterns = [
    path("review/", views.review_list, name="review"),
    path("review/bulk/", views.review_bulk, name="review_bulk"),
    path("review/policy/<int:tenant_id>/", views.review_policy, name="review_policy"),
    path("review/<int:sample_id>/", views.review_detail, name="review_sample"),
    path("review/<int:sample_id>/decide/", views.review_decide, name="review_decide"),
    path("privacy/", views.privacy, name="privacy"),
    path("privacy/switches/", views.privacy_switches, name="privacy_switches"),
    path("privacy/keys/<int:key_id>/", views.privacy_key, name="privacy_key"),
    path("privacy/samples/<int:sample_id>/delete/", views.privacy_sample_delete,
         name="privacy_sample_delete"),
    path("privacy/export/", views.privacy_export, name="privacy_export"),
    path("privacy/delete-account/", views.privacy_delete_account, name="privacy_delete_account"),
]
