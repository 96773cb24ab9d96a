from django.urls import path

from clawhub.keys import views

urlpatterns = [
    path("keys/", views.keys, name="keys"),
    path("keys/<int:key_id>/", views.key_detail, name="key_detail"),
    path("keys/<int:key_id>/secret/", views.key_secret, name="key_secret"),
    path("keys/<int:key_id>/edit/", views.key_edit, name="key_edit"),
    path("keys/<int:key_id>/rotate/", views.key_rotate_view, name="key_rotate"),
    path("keys/<int:key_id>/revoke/", views.key_revoke_view, name="key_revoke"),
    path("keys/<int:key_id>/openclaw.json", views.key_openclaw_download, name="key_openclaw_download"),
]
