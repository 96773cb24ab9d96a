from django.urls import path

from clawhub.groups import views

urlpatterns = [
    path("groups/", views.group_list, name="groups"),
    path("groups/<slug:slug>/rename/", views.group_rename, name="group_rename"),
    path("groups/<slug:slug>/delete/", views.group_delete, name="group_delete"),
    path("groups/<slug:slug>/leave/", views.group_leave, name="group_leave"),
    path("groups/<slug:slug>/transfer/", views.group_transfer, name="group_transfer"),
    path("groups/<slug:slug>/invitations/", views.group_invite, name="group_invite"),
    path("groups/<slug:slug>/invitations/<int:invitation_id>/revoke/", views.group_invitation_revoke,
         name="group_invitation_revoke"),
    path("groups/<slug:slug>/members/<int:user_id>/role/", views.group_member_role, name="group_member_role"),
    path("groups/<slug:slug>/members/<int:user_id>/remove/", views.group_member_remove,
         name="group_member_remove"),
    path("invitations/<str:token>/", views.invitation, name="invitation"),
]
