from django.urls import path

from clawhub.web import conversations

urlpatterns = [
    path("conversations/", conversations.conversation_list, name="conversations"),
    path("conversations/<int:session_id>/", conversations.conversation_detail, name="conversation"),
    path("conversations/turns/<int:turn_id>/feedback/", conversations.turn_feedback, name="turn_feedback"),
]
