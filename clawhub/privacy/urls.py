from django.urls import path

from clawhub.privacy import views

urlpatterns = [
    path("privacy/", views.privacy, name="privacy"),
    path("privacy/switches/", views.privacy_switches, name="privacy_switches"),
    path("privacy/keys/<int:key_id>/", views.privacy_key, name="privacy_key"),
    path("privacy/samples/<int:sample_id>/delete/", views.privacy_sample_delete,
         name="privacy_sample_delete"),
    path("privacy/export/", views.privacy_export, name="privacy_export"),
    path("privacy/delete-account/", views.privacy_delete_account, name="privacy_delete_account"),
]
