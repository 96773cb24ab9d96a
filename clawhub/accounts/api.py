"""REST API for sign-up, sign-in, passwords, email verification, the current user and the audit log."""

from django.conf import settings
from django.contrib import auth
from django.contrib.auth import update_session_auth_hash
from django.middleware.csrf import get_token
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from drf_spectacular.utils import (
    OpenApiResponse,
    extend_schema,
    extend_schema_field,
    inline_serializer,
)
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.accounts import selectors, services
from clawhub.core.api import PAGE_PARAMETERS, Pagination, client_ip, openapi_error
from clawhub.core.exceptions import ValidationFailed

_RESET_SENT = "If an account exists for this address, we sent it a link to reset the password."
_VERIFICATION_SENT = "If this address has an account that still needs confirming, we sent it a new link."

# --- OpenAPI description ------------------------------------------------------------------------------------
# The views return plain dicts, so their response shapes are declared here for drf-spectacular. Each
# inline_serializer is built once: two built with the same name would be two components that collide.
TAGS = ["accounts"]
INVALID = openapi_error("Invalid input; data.fields names the fields.")
CSRF_FAILED = openapi_error("The CSRF token (GET /api/auth/csrf/) is missing or wrong.")
NOT_SIGNED_IN = openapi_error("No valid session or API key.")
# Session-only views have no authenticator that asks for credentials, so DRF answers 403 rather than 401.
NO_SESSION = openapi_error("Not signed in with a session, or the CSRF token is wrong.")
TOO_MANY = openapi_error("Too many failed attempts; Retry-After says when to try again.")


class UserOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    email = serializers.EmailField()
    display_name = serializers.CharField()
    is_staff = serializers.BooleanField()
    email_verified = serializers.SerializerMethodField()
    tenant_id = serializers.IntegerField(source="tenant.pk",
                                         help_text="The user's personal tenant (training, adapters, review).")

    def get_email_verified(self, user) -> bool:
        return user.email_verified_at is not None


CSRF_TOKEN_OUTPUT = inline_serializer(name="CsrfTokenOutput", fields={
    "csrf_token": serializers.CharField(help_text="Send it back as the X-CSRFToken header on writes."),
})
NOTICE_OUTPUT = inline_serializer(name="AccountNoticeOutput", fields={"detail": serializers.CharField()})
USER_ONLY_OUTPUT = inline_serializer(name="UserOnlyOutput", fields={"user": UserOutputSerializer()})


class CsrfProtectedAnonymousApi(APIView):
    """Base for the endpoints anonymous callers use (sign-up, login, password reset, verification).

    DRF's SessionAuthentication checks CSRF only for a request that is already logged in, and APIView exempts
    itself from Django's middleware, so without this a hostile page could log a visitor into an attacker's
    account (login CSRF). The token comes from GET /api/auth/csrf/.
    """

    authentication_classes: list = []
    permission_classes = [AllowAny]

    def initial(self, request, *args, **kwargs):
        super().initial(request, *args, **kwargs)
        SessionAuthentication().enforce_csrf(request)


@method_decorator(ensure_csrf_cookie, name="dispatch")
class CsrfTokenApi(APIView):
    authentication_classes: list = []
    permission_classes = [AllowAny]

    @extend_schema(tags=TAGS, responses=CSRF_TOKEN_OUTPUT)
    def get(self, request):
        return Response({"csrf_token": get_token(request)})


@extend_schema_field({"type": "object", "nullable": True, "not": {}})  # null and nothing else
class _AlwaysNull(serializers.Field):
    """A field sign-up keeps for its clients: it is always null."""


class SignupApi(CsrfProtectedAnonymousApi):
    """Create an account. Answers every address alike, new or already taken (whose owner gets a mail), and
    signs nobody in: log in next (POST /api/auth/login/)."""

    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)
        password = serializers.CharField(max_length=4096, trim_whitespace=False)
        display_name = serializers.CharField(max_length=150, required=False, allow_blank=True, default="")

        class Meta:
            ref_name = "SignupInput"

    @extend_schema(tags=TAGS, request=InputSerializer, responses={
        201: inline_serializer(name="SignupOutput", fields={
            "user": _AlwaysNull(help_text="Always null: sign-up signs nobody in, so that its answer does not "
                                          "tell whether the address already had an account. Log in to get "
                                          "the user (POST /api/auth/login/)."),
            "logged_in": serializers.BooleanField(help_text="Always false, for the same reason."),
            "email_verification_required": serializers.BooleanField(
                help_text="The site's rule, the same for every address: true when a new account must "
                          "confirm its address (the mailed link) before it can log in."),
            "csrf_token": serializers.CharField(help_text="The token to use from now on."),
        }),
        400: INVALID,
        403: CSRF_FAILED,
    })
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.user_signup(ip=client_ip(request), **data.validated_data)
        return Response({
            "user": None,
            "logged_in": False,
            "email_verification_required": settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION,
            "csrf_token": get_token(request),
        }, status=status.HTTP_201_CREATED)


class LoginApi(CsrfProtectedAnonymousApi):
    """Sign in with email and password; starts a session."""

    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)
        password = serializers.CharField(max_length=4096, trim_whitespace=False)

        class Meta:
            ref_name = "LoginInput"

    @extend_schema(tags=TAGS, request=InputSerializer, responses={
        200: inline_serializer(name="LoginOutput", fields={
            "user": UserOutputSerializer(),
            "csrf_token": serializers.CharField(help_text="Login rotates the token; use this one from now."),
        }),
        400: INVALID,
        401: openapi_error("Wrong email or password (invalid_credentials), or an unconfirmed address "
                           "(email_unverified)."),
        403: CSRF_FAILED,
        429: TOO_MANY,
    })
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user, _first_sign_in = services.user_login(request=request, **data.validated_data)
        return Response({"user": UserOutputSerializer(user).data, "csrf_token": get_token(request)})


class LogoutApi(APIView):
    # Session only: an API key has no session to end.
    authentication_classes = [SessionAuthentication]

    @extend_schema(tags=TAGS, request=None, responses={
        204: OpenApiResponse(description="Signed out; the session is gone."),
        403: NO_SESSION,
    })
    def post(self, request):
        services.user_logout(request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class LogoutEverywhereApi(APIView):
    """Ends every session of the account on every device, this one included. API keys stay (revoke them on the
    key pages)."""

    authentication_classes = [SessionAuthentication]

    @extend_schema(tags=TAGS, request=None, responses={
        204: OpenApiResponse(description="Every session of the account is gone, this one too."),
        403: NO_SESSION,
    })
    def post(self, request):
        services.user_sessions_end_all(user=request.user, actor=request.user, ip=client_ip(request),
                                       request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PasswordChangeApi(APIView):
    # Session only: a leaked API key must not be enough to take over the account.
    authentication_classes = [SessionAuthentication]

    class InputSerializer(serializers.Serializer):
        old_password = serializers.CharField(max_length=4096, trim_whitespace=False)
        new_password = serializers.CharField(max_length=4096, trim_whitespace=False)

        class Meta:
            ref_name = "PasswordChangeInput"

    @extend_schema(tags=TAGS, request=InputSerializer, responses={
        200: CSRF_TOKEN_OUTPUT,
        400: openapi_error("Invalid input or a weak new password (weak_password)."),
        403: openapi_error("A wrong current password (wrong_password), or not a signed-in session with its "
                           "CSRF token."),
    })
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_password_change(user=request.user, ip=client_ip(request), **data.validated_data)
        update_session_auth_hash(request, user)
        return Response({"csrf_token": get_token(request)})


class PasswordResetApi(CsrfProtectedAnonymousApi):
    """Mail a password-reset link to the address, if it has an account."""

    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)

        class Meta:
            ref_name = "PasswordResetInput"

    # The same 202 whether or not the address has an account, so the endpoint reveals nobody.
    @extend_schema(tags=TAGS, request=InputSerializer,
                   responses={202: NOTICE_OUTPUT, 400: INVALID, 403: CSRF_FAILED})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.password_reset_request(email=data.validated_data["email"], ip=client_ip(request))
        return Response({"detail": _RESET_SENT}, status=status.HTTP_202_ACCEPTED)


class PasswordResetConfirmApi(CsrfProtectedAnonymousApi):
    """Set a new password with the uid and token from a reset link."""

    class InputSerializer(serializers.Serializer):
        uid = serializers.CharField(max_length=64)
        token = serializers.CharField(max_length=128)
        new_password = serializers.CharField(max_length=4096, trim_whitespace=False)
        revoke_keys = serializers.BooleanField(
            required=False, default=False,
            help_text="Also revoke every API key of the account (advised if you suspect a compromise).")

        class Meta:
            ref_name = "PasswordResetConfirmInput"

    @extend_schema(tags=TAGS, request=InputSerializer, responses={
        200: NOTICE_OUTPUT,
        400: openapi_error("Invalid input, an invalid or expired link, or a weak password."),
        403: CSRF_FAILED,
    })
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        services.password_reset_confirm(uidb64=v["uid"], token=v["token"], new_password=v["new_password"],
                                        revoke_keys=v["revoke_keys"], ip=client_ip(request))
        return Response({"detail": "Your password has been set. You can log in now."})


class VerifyEmailApi(CsrfProtectedAnonymousApi):
    """Confirm an email address with the token from a verification link."""

    class InputSerializer(serializers.Serializer):
        token = serializers.CharField(max_length=512)

        class Meta:
            ref_name = "VerifyEmailInput"

    @extend_schema(tags=TAGS, request=InputSerializer, responses={
        200: USER_ONLY_OUTPUT,
        400: openapi_error("Invalid input, or an invalid or expired link."),
        403: CSRF_FAILED,
    })
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        # This view authenticates nobody (login CSRF), and DRF has set the Django request's user to nobody
        # too, so the session's user is read from the session itself.
        signed_in = auth.get_user(request._request)
        user = services.user_email_verify(token=data.validated_data["token"], ip=client_ip(request),
                                          signed_in=signed_in if signed_in and signed_in.is_authenticated
                                          else None)
        return Response({"user": UserOutputSerializer(user).data})


class VerifyEmailResendApi(CsrfProtectedAnonymousApi):
    """Mail a new verification link to the address, if it still needs one."""

    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)

        class Meta:
            ref_name = "VerifyEmailResendInput"

    # Like the password reset: the same 202 for every address.
    @extend_schema(tags=TAGS, request=InputSerializer,
                   responses={202: NOTICE_OUTPUT, 400: INVALID, 403: CSRF_FAILED})
    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.email_verification_resend(email=data.validated_data["email"], ip=client_ip(request))
        return Response({"detail": _VERIFICATION_SENT}, status=status.HTTP_202_ACCEPTED)


class MeApi(APIView):
    class InputSerializer(serializers.Serializer):
        display_name = serializers.CharField(max_length=150, allow_blank=True)

        class Meta:
            ref_name = "MeUpdateInput"

    class OutputSerializer(UserOutputSerializer):
        tenant_id = serializers.IntegerField(
            source="tenant.pk",
            help_text="The user's personal tenant, as /api/training/tenants/{tenant_id}/… and "
                      "/api/adapters/tenants/{tenant_id}/… take it.")

        class Meta:
            ref_name = "MeOutput"

    @extend_schema(tags=TAGS, responses={200: OutputSerializer, 401: NOT_SIGNED_IN})
    def get(self, request):
        return Response(self.OutputSerializer(request.user).data)

    @extend_schema(tags=TAGS, request=InputSerializer,
                   responses={200: OutputSerializer, 400: INVALID, 401: NOT_SIGNED_IN})
    def patch(self, request):
        data = self.InputSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        if not data.validated_data:
            raise ValidationFailed("Send the fields to change (display_name).", code="empty_update")
        user = request.user
        if "display_name" in data.validated_data:
            user = services.user_update(user=user, actor=user, ip=client_ip(request),
                                        display_name=data.validated_data["display_name"])
        return Response(self.OutputSerializer(user).data)


class AuditPagination(Pagination):
    page_size = 50
    max_page_size = 200


class AuditListApi(APIView):
    # Declared so the schema shows the page envelope (count/next/previous/results); get() pages by hand.
    pagination_class = AuditPagination

    class FilterSerializer(serializers.Serializer):
        group = serializers.CharField(max_length=60, required=False, default="")
        all = serializers.BooleanField(required=False, default=False)

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        created_at = serializers.DateTimeField()
        action = serializers.CharField()
        actor = serializers.EmailField(source="actor.email", default=None, allow_null=True)
        subject_user = serializers.EmailField(source="subject_user.email", default=None, allow_null=True)
        group = serializers.CharField(source="group.slug", default=None, allow_null=True)
        target_type = serializers.CharField()
        target_id = serializers.CharField()
        target_repr = serializers.CharField()
        ip = serializers.SerializerMethodField()
        data = serializers.JSONField()

        def get_ip(self, row) -> str | None:
            return row.ip if selectors.audit_ip_visible(row=row, viewer=self.context["viewer"]) else None

        class Meta:
            ref_name = "AuditEntryOutput"

    @extend_schema(
        tags=TAGS,
        parameters=[
            FilterSerializer,
            *PAGE_PARAMETERS,
        ],
        responses={
            200: OutputSerializer(many=True),
            400: INVALID,
            401: NOT_SIGNED_IN,
            403: openapi_error("Not an admin of the group, or not staff (all=true)."),
            404: openapi_error("No such group."),
        },
    )
    def get(self, request):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        rows = selectors.audit_list(user=request.user, group_slug=filters.validated_data["group"],
                                    everything=filters.validated_data["all"])
        paginator = self.pagination_class()
        page = paginator.paginate_queryset(rows, request, view=self)
        out = self.OutputSerializer(page, many=True, context={"viewer": request.user})
        return paginator.get_paginated_response(out.data)
