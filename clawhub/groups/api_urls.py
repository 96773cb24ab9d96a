from django.urls import path

from clawhub.groups import api

urlpatterns = [
    path("groups/", api.one_url(api.GroupListApi, api.GroupCreateApi).as_view(), name="api-groups"),
    path("groups/<slug:slug>/",
         api.one_url(api.GroupDetailApi, api.GroupUpdateApi, api.GroupDeleteApi).as_view(), name="api-group"),
    path("groups/<slug:slug>/members/", api.MemberListApi.as_view(), name="api-group-members"),
    path("groups/<slug:slug>/members/<int:user_id>/",
         api.one_url(api.MemberUpdateApi, api.MemberRemoveApi).as_view(), name="api-group-member"),
    path("groups/<slug:slug>/leave/", api.GroupLeaveApi.as_view(), name="api-group-leave"),
    path("groups/<slug:slug>/transfer/", api.GroupTransferApi.as_view(), name="api-group-transfer"),
    path("groups/<slug:slug>/invitations/",
         api.one_url(api.InvitationListApi, api.InvitationCreateApi).as_view(), name="api-group-invitations"),
    path("groups/<slug:slug>/invitations/<int:invitation_id>/", api.InvitationRevokeApi.as_view(),
         name="api-group-invitation"),
    path("invitations/<str:token>/", api.InvitationDetailApi.as_view(), name="api-invitation"),
    path("invitations/<str:token>/accept/", api.InvitationAcceptApi.as_view(), name="api-invitation-accept"),
    path("invitations/<str:token>/decline/", api.InvitationDeclineApi.as_view(),
         name="api-invitation-decline"),
]
