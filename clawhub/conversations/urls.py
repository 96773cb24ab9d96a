from django.urls import path

from clawhub.conversations import views

urlpatterns = [
    path("conversations/", views.conversation_list, name="conversations"),
    path("conversations/<int:session_id>/", views.conversation_detail, name="conversation"),
    path("conversations/turns/<int:turn_id>/feedback/", views.turn_feedback, name="turn_feedback"),
]
