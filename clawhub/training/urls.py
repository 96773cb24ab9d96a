from django.urls import path

from clawhub.training import views

# The adapter pages live here too: they share the tenant resolution and the page helpers with training.
urlpatterns = [
    path("training/", views.training_index, name="training"),
    path("training/<int:tenant_id>/", views.training_tenant, name="training_tenant"),
    path("training/<int:tenant_id>/start/", views.training_start, name="training_start"),
    path("training/<int:tenant_id>/settings/", views.training_settings, name="training_settings"),
    path("training/runs/<int:run_id>/", views.run_detail, name="training_run"),
    path("training/runs/<int:run_id>/cancel/", views.run_cancel, name="training_run_cancel"),
    path("training/runs/<int:run_id>/progress/", views.run_progress_json, name="training_run_progress"),
    path("adapters/<int:tenant_id>/", views.adapter_versions, name="adapter_versions"),
    path("adapters/<int:tenant_id>/pin/", views.adapter_pin, name="adapter_pin"),
    path("adapters/versions/<int:version_id>/rollback/", views.adapter_rollback, name="adapter_rollback"),
]
