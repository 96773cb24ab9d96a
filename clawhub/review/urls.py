from django.urls import path

from clawhub.review import views

urlpatterns = [
    path("review/", views.review_list, name="review"),
    path("review/bulk/", views.review_bulk, name="review_bulk"),
    path("review/policy/<int:tenant_id>/", views.review_policy, name="review_policy"),
    path("review/<int:sample_id>/", views.review_detail, name="review_sample"),
    path("review/<int:sample_id>/decide/", views.review_decide, name="review_decide"),
]
