from django.urls import path

from clawhub.conversations import api

urlpatterns = [
    path("sessions/", api.SessionListApi.as_view(), name="api-sessions"),
    path("sessions/<int:session_id>/", api.SessionDetailApi.as_view(), name="api-session"),
    path("conversations/tenants/<int:tenant_id>/settings/", api.ConversationSettingsApi.as_view(),
         name="api-conversation-settings"),
]
