from django.urls import path

from clawhub.web import group_page, playground, views

urlpatterns = [
    path("", views.home, name="home"),
    path("favicon.ico", views.favicon, name="favicon"),
    path("dashboard/", views.dashboard, name="dashboard"),
    path("learning/", views.learning_index, name="learning_index"),
    path("learning/<int:tenant_id>/", views.learning, name="learning"),
    path("playground/", playground.playground, name="playground"),
    path("playground/key/", playground.playground_key, name="playground_key"),
    # The group page (the group's actions stay under groups/ in clawhub/groups/urls.py).
    path("groups/<slug:slug>/", group_page.group_detail, name="group_detail"),
]
