"""REST API for groups, memberships and invitations. Thin: validate, resolve the group once, call a service.

Every group-scoped view is a ``clawhub.tenants.access.GroupApi``: it resolves (the group's tenant, the
caller's role) from the slug before the handler runs, so non-members get 404 before anything else happens; the
services check the role again for the operation itself.
"""

from drf_spectacular.utils import OpenApiResponse, extend_schema, inline_serializer
from rest_framework import serializers, status
from rest_framework.request import Request
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.core.api import client_ip, openapi_error
from clawhub.core.exceptions import PermissionDenied
from clawhub.groups import selectors, services
from clawhub.groups.models import Group, Invitation, Role
from clawhub.groups.rules import can_manage
from clawhub.tenants import naming
from clawhub.tenants.access import GroupApi, TenantAccess


def one_url(*operations: type[APIView]) -> type[APIView]:
    """One APIView class for a URL served by several single-operation views (GET list + POST create, ...).

    Each operation class defines only its own HTTP method and refers to its own nested serializers by class
    name, so combining them by inheritance cannot mix them up. For the same reason their @extend_schema passes
    ``description=__doc__`` (the class body's own docstring): the combined class's docstring joins them all.
    """
    name = "".join(op.__name__.removesuffix("Api") for op in operations) + "Api"
    return type(name, operations, {"__doc__": " / ".join(op.__doc__ or op.__name__ for op in operations)})


# --- OpenAPI description ------------------------------------------------------------------------------------
TAGS = ["groups"]
def _empty(description: str) -> OpenApiResponse:
    return OpenApiResponse(description=description)


INVALID = openapi_error("Invalid input; data.fields names the fields.")
NOT_SIGNED_IN = openapi_error("No valid session or API key.")
# Non-members get 404, not 403, so a slug reveals nothing about groups the caller is not in.
NOT_A_MEMBER = openapi_error("No such group, or the caller is not a member.")
FORBIDDEN = openapi_error("The caller's role does not allow this.")
NO_SUCH_INVITATION = openapi_error("The invitation link is not valid (invitation_not_found).")
NO_SUCH_MEMBER = openapi_error("No such group or member, or the caller is not a member.")
# Accepting and declining refuse for the same reasons: both services check the invitation the same way.
INVITEE_ERRORS = {
    400: openapi_error("Invalid input."),
    401: NOT_SIGNED_IN,
    403: openapi_error("The invitation was sent to another address (wrong_email), or that address is not "
                       "confirmed yet (email_unverified)."),
    404: NO_SUCH_INVITATION,
    409: openapi_error("The invitation is no longer open (invitation_used, _declined, _revoked, _expired), "
                       "or the caller is already a member (already_member)."),
}


class GroupOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    name = serializers.CharField()
    slug = serializers.CharField()
    model_id = serializers.SerializerMethodField()
    role = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()

    def get_model_id(self, group: Group) -> str:
        return naming.group_model_id(group.slug)

    def get_role(self, group: Group) -> str:
        # The caller's role: from the list annotation, or passed in the context by single-group views.
        return getattr(group, "my_role", None) or str(self.context["role"])


# The list leaves the tenant out: it would cost a query per group.
class GroupDetailOutputSerializer(GroupOutputSerializer):
    tenant_id = serializers.IntegerField(
        source="tenant.pk",
        help_text="The group's tenant, as /api/training/tenants/{tenant_id}/… and "
                  "/api/adapters/tenants/{tenant_id}/… take it.")


def _group_response(group: Group, role: Role | str, status_code: int = status.HTTP_200_OK, *,
                    serializer: type[GroupOutputSerializer] = GroupOutputSerializer) -> Response:
    return Response(serializer(group, context={"role": role}).data, status=status_code)


# --- groups -------------------------------------------------------------------------------------------------


class GroupListApi(APIView):
    """List the caller's groups, with the caller's role in each."""

    # GET /api/groups/ and GET /api/groups/{slug}/ would both be "groups_retrieve" without explicit ids.
    @extend_schema(tags=TAGS, description=__doc__, operation_id="groups_list",
                   responses={200: GroupOutputSerializer(many=True), 401: NOT_SIGNED_IN})
    def get(self, request: Request) -> Response:
        groups = selectors.groups_for_user(user=request.user)
        return Response(GroupOutputSerializer(groups, many=True).data)


class GroupCreateApi(APIView):
    """Create a group; the caller becomes its owner."""

    class InputSerializer(serializers.Serializer):
        # The slug is made from the slug if given, else from the name: it keeps ASCII letters and digits.
        name = serializers.CharField(max_length=100, style={"openapi": {"pattern": "[A-Za-z0-9]"}})
        slug = serializers.CharField(max_length=60, required=False, allow_blank=True,
                                     style={"openapi": {"pattern": "^$|[A-Za-z0-9]"}})

        class Meta:
            ref_name = "GroupCreateInput"

    @extend_schema(tags=TAGS, description=__doc__, request=InputSerializer, responses={
        201: GroupOutputSerializer,
        400: INVALID,
        401: NOT_SIGNED_IN,
        409: openapi_error("A group with this slug already exists (slug_taken)."),
    })
    def post(self, request: Request) -> Response:
        data = GroupCreateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        group = services.group_create(actor=request.user, ip=client_ip(request), **data.validated_data)
        return _group_response(group, Role.OWNER, status.HTTP_201_CREATED)


class GroupDetailApi(GroupApi):
    """One group, with the caller's role."""

    @extend_schema(tags=TAGS, description=__doc__, operation_id="groups_retrieve",
                   responses={200: GroupDetailOutputSerializer, 401: NOT_SIGNED_IN, 404: NOT_A_MEMBER})
    def get(self, request: Request, access: TenantAccess) -> Response:
        group, role = access.group, access.group_role
        return _group_response(group, role, serializer=GroupDetailOutputSerializer)


class GroupUpdateApi(GroupApi):
    """Rename a group (admins and the owner). The slug never changes."""

    class InputSerializer(serializers.Serializer):
        name = serializers.CharField(max_length=100)

        class Meta:
            ref_name = "GroupUpdateInput"

    # drf-spectacular marks every PATCH field optional; this view is not partial, so the text says so.
    @extend_schema(tags=TAGS, description=f"{__doc__} `name` is required.", request=InputSerializer,
                   responses={200: GroupDetailOutputSerializer, 400: INVALID, 401: NOT_SIGNED_IN,
                              403: FORBIDDEN, 404: NOT_A_MEMBER})
    def patch(self, request: Request, access: TenantAccess) -> Response:
        group, role = access.group, access.group_role
        data = GroupUpdateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        group = services.group_update(actor=request.user, group=group, ip=client_ip(request),
                                      **data.validated_data)
        return _group_response(group, role, serializer=GroupDetailOutputSerializer)


class GroupDeleteApi(GroupApi):
    """Delete a group (owner only); its keys are revoked."""

    @extend_schema(tags=TAGS, description=__doc__, responses={
        204: _empty("Deleted."), 401: NOT_SIGNED_IN, 403: FORBIDDEN, 404: NOT_A_MEMBER,
    })
    def delete(self, request: Request, access: TenantAccess) -> Response:
        group = access.group
        services.group_delete(actor=request.user, group=group, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class GroupLeaveApi(GroupApi):
    """Leave a group. The owner must transfer ownership first."""

    @extend_schema(tags=TAGS, request=None, responses={
        204: _empty("Left the group."),
        401: NOT_SIGNED_IN,
        404: NOT_A_MEMBER,
        409: openapi_error("The owner cannot leave; transfer ownership first."),
    })
    def post(self, request: Request, access: TenantAccess) -> Response:
        group = access.group
        services.membership_leave(actor=request.user, group=group, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


class GroupTransferApi(GroupApi):
    """Transfer ownership to a member (owner only); the old owner becomes admin."""

    class InputSerializer(serializers.Serializer):
        user_id = serializers.IntegerField(min_value=1, max_value=selectors.ID_MAX)

        class Meta:
            ref_name = "GroupTransferInput"

    @extend_schema(tags=TAGS, request=InputSerializer, responses={
        200: OpenApiResponse(GroupOutputSerializer, description="The group, with the caller now an admin."),
        400: INVALID,
        401: NOT_SIGNED_IN,
        403: FORBIDDEN,
        404: NO_SUCH_MEMBER,
        409: openapi_error("The new owner is the caller (already_owner)."),
    })
    def post(self, request: Request, access: TenantAccess) -> Response:
        group = access.group
        data = GroupTransferApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        target = selectors.group_member_get(group=group, user_id=data.validated_data["user_id"])
        services.group_transfer_ownership(actor=request.user, group=group, new_owner=target.user,
                                          ip=client_ip(request))
        return _group_response(group, Role.ADMIN)


# --- members ------------------------------------------------------------------------------------------------


class MemberOutputSerializer(serializers.Serializer):
    user_id = serializers.IntegerField()
    email = serializers.EmailField(source="user.email")
    name = serializers.CharField(source="user.name")
    role = serializers.CharField()
    joined_at = serializers.DateTimeField(source="created_at")


class MemberListApi(GroupApi):
    """The group's members (any member may see them)."""

    @extend_schema(tags=TAGS, responses={
        200: inline_serializer(name="GroupMembersOutput", fields={
            "role": serializers.CharField(help_text="The caller's role in the group."),
            "members": MemberOutputSerializer(many=True),
        }),
        401: NOT_SIGNED_IN,
        404: NOT_A_MEMBER,
    })
    def get(self, request: Request, access: TenantAccess) -> Response:
        group, role = access.group, access.group_role
        members = selectors.group_members(group=group)
        return Response({"role": role, "members": MemberOutputSerializer(members, many=True).data})


class _GrantableRoleField(serializers.ChoiceField):
    """A role that can be given by a role change or an invitation: not "owner", which the service refuses
    (with use_transfer for a role change: an ownership transfer makes someone the owner), so that the refusal
    says what to do instead."""

    def to_internal_value(self, data):
        return Role.OWNER.value if data == Role.OWNER else super().to_internal_value(data)


class MemberUpdateApi(GroupApi):
    """Change a member's role."""

    class InputSerializer(serializers.Serializer):
        role = _GrantableRoleField(choices=[c for c in Role.choices if c[0] != Role.OWNER])

        class Meta:
            ref_name = "MemberUpdateInput"

    @extend_schema(tags=TAGS, description=f"{__doc__} `role` is required.", request=InputSerializer,
                   responses={
                       200: MemberOutputSerializer,
                       400: openapi_error(
                           "Invalid input, or an attempt to make someone the owner (use_transfer)."
                       ),
                       401: NOT_SIGNED_IN,
                       403: FORBIDDEN,
                       404: NO_SUCH_MEMBER,
                   })
    def patch(self, request: Request, access: TenantAccess, user_id: int) -> Response:
        group = access.group
        data = MemberUpdateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        target = selectors.group_member_get(group=group, user_id=user_id)
        membership = services.membership_change_role(actor=request.user, group=group, user=target.user,
                                                     role=data.validated_data["role"], ip=client_ip(request))
        return Response(MemberOutputSerializer(membership).data)


class MemberRemoveApi(GroupApi):
    """Remove a member; their keys bound to the group are revoked. Removing yourself is leaving."""

    @extend_schema(tags=TAGS, description=__doc__, responses={
        204: _empty("Removed."),
        401: NOT_SIGNED_IN,
        403: FORBIDDEN,
        404: NO_SUCH_MEMBER,
    })
    def delete(self, request: Request, access: TenantAccess, user_id: int) -> Response:
        group = access.group
        target = selectors.group_member_get(group=group, user_id=user_id)
        services.membership_remove(actor=request.user, group=group, user=target.user, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- invitations (group side) -------------------------------------------------------------------------------


class InvitationOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    email = serializers.CharField(help_text="The address it was sent to; empty for a link invitation.")
    role = serializers.CharField()
    status = serializers.SerializerMethodField()
    invited_by = serializers.SerializerMethodField()
    created_at = serializers.DateTimeField()
    expires_at = serializers.DateTimeField()

    def get_status(self, invitation: Invitation) -> str:
        return selectors.invitation_status(invitation)

    def get_invited_by(self, invitation: Invitation) -> str | None:
        return invitation.invited_by.email if invitation.invited_by_id else None


class InvitationListApi(GroupApi):
    """Open invitations of the group (admins and the owner)."""

    @extend_schema(tags=TAGS, description=__doc__, responses={
        200: InvitationOutputSerializer(many=True), 401: NOT_SIGNED_IN, 403: FORBIDDEN, 404: NOT_A_MEMBER,
    })
    def get(self, request: Request, access: TenantAccess) -> Response:
        group, role = access.group, access.group_role
        if not can_manage(role):
            # A read has no service to refuse it; this is the same rule invitation_create enforces.
            raise PermissionDenied("Only a group admin or the owner may see invitations.")
        invitations = selectors.group_invitations(group=group)
        return Response(InvitationOutputSerializer(invitations, many=True).data)


class InvitationCreateApi(GroupApi):
    """Invite by email (the link is mailed) or create a link-only invitation (the link is returned, once)."""

    class InputSerializer(serializers.Serializer):
        email = serializers.EmailField(required=False, allow_blank=True, default="")
        # Not "owner" (an invitation never makes an owner): the service still says why when it is sent.
        role = _GrantableRoleField(choices=[c for c in Role.choices if c[0] != Role.OWNER],
                                   default=Role.MEMBER)

        class Meta:
            ref_name = "InvitationCreateInput"

    class OutputSerializer(InvitationOutputSerializer):
        link = serializers.SerializerMethodField()

        def get_link(self, invitation: Invitation) -> str | None:
            # Email invitations travel by email only; a link-only invitation has no other way to reach anyone.
            return None if invitation.email else self.context["link"]

        class Meta:
            ref_name = "InvitationCreateOutput"

    @extend_schema(tags=TAGS, description=__doc__, request=InputSerializer, responses={
        201: OutputSerializer,
        400: INVALID,
        401: NOT_SIGNED_IN,
        403: FORBIDDEN,
        404: NOT_A_MEMBER,
        409: openapi_error("Already a member (already_member), or the address has an open invitation."),
    })
    def post(self, request: Request, access: TenantAccess) -> Response:
        group = access.group
        data = InvitationCreateApi.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        invitation, link = services.invitation_create(actor=request.user, group=group, ip=client_ip(request),
                                                      **data.validated_data)
        output = InvitationCreateApi.OutputSerializer(invitation, context={"link": link})
        return Response(output.data, status=status.HTTP_201_CREATED)


class InvitationRevokeApi(GroupApi):
    """Revoke an open invitation (admins and the owner)."""

    @extend_schema(tags=TAGS, responses={
        204: _empty("Revoked."),
        401: NOT_SIGNED_IN,
        403: FORBIDDEN,
        404: openapi_error("No such group or invitation, or the caller is not a member."),
        409: openapi_error("The invitation was already accepted, declined or revoked."),
    })
    def delete(self, request: Request, access: TenantAccess, invitation_id: int) -> Response:
        group = access.group
        invitation = selectors.group_invitation_get(group=group, invitation_id=invitation_id)
        services.invitation_revoke(actor=request.user, invitation=invitation, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)


# --- invitations (invitee side) -----------------------------------------------------------------------------


class InvitationDetailApi(APIView):
    """What an invitation link offers: which group, which role, and whether it is still open."""

    class OutputSerializer(serializers.Serializer):
        group = serializers.SerializerMethodField()
        role = serializers.CharField()
        email = serializers.CharField(help_text="The address it was sent to; empty for a link invitation.")
        invited_by = serializers.SerializerMethodField()
        status = serializers.SerializerMethodField()
        expires_at = serializers.DateTimeField()

        def get_group(self, invitation: Invitation) -> dict:
            return {"name": invitation.group.name, "slug": invitation.group.slug}

        def get_invited_by(self, invitation: Invitation) -> str | None:
            return invitation.invited_by.name if invitation.invited_by_id else None

        def get_status(self, invitation: Invitation) -> str:
            return selectors.invitation_status(invitation)

        class Meta:
            ref_name = "InvitationDetailOutput"

    @extend_schema(tags=TAGS, responses={200: OutputSerializer, 401: NOT_SIGNED_IN, 404: NO_SUCH_INVITATION})
    def get(self, request: Request, token: str) -> Response:
        invitation = selectors.invitation_get_by_token(token=token)
        return Response(InvitationDetailApi.OutputSerializer(invitation).data)


class InvitationAcceptApi(APIView):
    """Accept an invitation as the signed-in user; returns the group with the caller's new role."""

    @extend_schema(tags=TAGS, request=None, responses={
        200: GroupOutputSerializer,
        **INVITEE_ERRORS,
    })
    def post(self, request: Request, token: str) -> Response:
        membership = services.invitation_accept(actor=request.user, token=token, ip=client_ip(request))
        return _group_response(membership.group, membership.role)


class InvitationDeclineApi(APIView):
    """Decline an invitation; it cannot be used afterwards."""

    @extend_schema(tags=TAGS, request=None, responses={
        204: _empty("Declined."),
        **INVITEE_ERRORS,
    })
    def post(self, request: Request, token: str) -> Response:
        services.invitation_decline(actor=request.user, token=token, ip=client_ip(request))
        return Response(status=status.HTTP_204_NO_CONTENT)

