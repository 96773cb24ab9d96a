"""REST API for sign-up, sign-in, passwords, email verification, the current user and the audit log."""

from django.conf import settings
from django.contrib.auth import login, update_session_auth_hash
from django.middleware.csrf import get_token
from django.utils.decorators import method_decorator
from django.views.decorators.csrf import ensure_csrf_cookie
from rest_framework import serializers, status
from rest_framework.authentication import SessionAuthentication
from rest_framework.pagination import PageNumberPagination
from rest_framework.permissions import AllowAny
from rest_framework.response import Response
from rest_framework.views import APIView

from clawhub.accounts import selectors, services
from clawhub.core.api import client_ip

_RESET_SENT = "If an account exists for this address, we sent it a link to reset the password."
_VERIFICATION_SENT = "If this address has an account that still needs confirming, we sent it a new link."


class UserOutputSerializer(serializers.Serializer):
    id = serializers.IntegerField()
    email = serializers.EmailField()
    display_name = serializers.CharField()
    is_staff = serializers.BooleanField()
    email_verified = serializers.SerializerMethodField()

    def get_email_verified(self, user) -> bool:
        return user.email_verified_at is not None


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

    def get(self, request):
        return Response({"csrf_token": get_token(request)})


class SignupApi(CsrfProtectedAnonymousApi):
    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)
        password = serializers.CharField(max_length=4096, trim_whitespace=False)
        display_name = serializers.CharField(max_length=150, required=False, allow_blank=True, default="")

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_signup(ip=client_ip(request), **data.validated_data)
        needs_verification = settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION
        if not needs_verification:
            login(request, user)
        return Response({
            "user": UserOutputSerializer(user).data,
            "logged_in": not needs_verification,
            "email_verification_required": needs_verification,
            # Login rotates the CSRF token; the caller needs the new one for its next write.
            "csrf_token": get_token(request),
        }, status=status.HTTP_201_CREATED)


class LoginApi(CsrfProtectedAnonymousApi):
    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)
        password = serializers.CharField(max_length=4096, trim_whitespace=False)

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_login(request=request, **data.validated_data)
        return Response({"user": UserOutputSerializer(user).data, "csrf_token": get_token(request)})


class LogoutApi(APIView):
    # Session only: an API key has no session to end.
    authentication_classes = [SessionAuthentication]

    def post(self, request):
        services.user_logout(request=request)
        return Response(status=status.HTTP_204_NO_CONTENT)


class PasswordChangeApi(APIView):
    # Session only: a leaked API key must not be enough to take over the account.
    authentication_classes = [SessionAuthentication]

    class InputSerializer(serializers.Serializer):
        old_password = serializers.CharField(max_length=4096, trim_whitespace=False)
        new_password = serializers.CharField(max_length=4096, trim_whitespace=False)

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_password_change(user=request.user, ip=client_ip(request), **data.validated_data)
        update_session_auth_hash(request, user)
        return Response({"csrf_token": get_token(request)})


class PasswordResetApi(CsrfProtectedAnonymousApi):
    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.password_reset_request(email=data.validated_data["email"], ip=client_ip(request))
        return Response({"detail": _RESET_SENT}, status=status.HTTP_202_ACCEPTED)


class PasswordResetConfirmApi(CsrfProtectedAnonymousApi):
    class InputSerializer(serializers.Serializer):
        uid = serializers.CharField(max_length=64)
        token = serializers.CharField(max_length=128)
        new_password = serializers.CharField(max_length=4096, trim_whitespace=False)

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        v = data.validated_data
        services.password_reset_confirm(uidb64=v["uid"], token=v["token"], new_password=v["new_password"],
                                        ip=client_ip(request))
        return Response({"detail": "Your password has been set. You can log in now."})


class VerifyEmailApi(CsrfProtectedAnonymousApi):
    class InputSerializer(serializers.Serializer):
        token = serializers.CharField(max_length=512)

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        user = services.user_email_verify(token=data.validated_data["token"], ip=client_ip(request))
        return Response({"user": UserOutputSerializer(user).data})


class VerifyEmailResendApi(CsrfProtectedAnonymousApi):
    class InputSerializer(serializers.Serializer):
        email = serializers.CharField(max_length=254)

    def post(self, request):
        data = self.InputSerializer(data=request.data)
        data.is_valid(raise_exception=True)
        services.email_verification_resend(email=data.validated_data["email"])
        return Response({"detail": _VERIFICATION_SENT}, status=status.HTTP_202_ACCEPTED)


class MeApi(APIView):
    class InputSerializer(serializers.Serializer):
        display_name = serializers.CharField(max_length=150, allow_blank=True)

    def get(self, request):
        return Response(UserOutputSerializer(request.user).data)

    def patch(self, request):
        data = self.InputSerializer(data=request.data, partial=True)
        data.is_valid(raise_exception=True)
        user = request.user
        if "display_name" in data.validated_data:
            user = services.user_update(user=user, actor=user, ip=client_ip(request),
                                        display_name=data.validated_data["display_name"])
        return Response(UserOutputSerializer(user).data)


class AuditPagination(PageNumberPagination):
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200


class AuditListApi(APIView):
    class FilterSerializer(serializers.Serializer):
        group = serializers.CharField(max_length=60, required=False, default="")
        all = serializers.BooleanField(required=False, default=False)

    class OutputSerializer(serializers.Serializer):
        id = serializers.IntegerField()
        created_at = serializers.DateTimeField()
        action = serializers.CharField()
        actor = serializers.EmailField(source="actor.email", default=None)
        subject_user = serializers.EmailField(source="subject_user.email", default=None)
        group = serializers.CharField(source="group.slug", default=None)
        target_type = serializers.CharField()
        target_id = serializers.CharField()
        target_repr = serializers.CharField()
        ip = serializers.SerializerMethodField()
        data = serializers.JSONField()

        def get_ip(self, row) -> str | None:
            return row.ip if selectors.audit_ip_visible(row=row, viewer=self.context["viewer"]) else None

    def get(self, request):
        filters = self.FilterSerializer(data=request.query_params)
        filters.is_valid(raise_exception=True)
        rows = selectors.audit_list(user=request.user, group_slug=filters.validated_data["group"],
                                    everything=filters.validated_data["all"])
        paginator = AuditPagination()
        page = paginator.paginate_queryset(rows, request, view=self)
        out = self.OutputSerializer(page, many=True, context={"viewer": request.user})
        return paginator.get_paginated_response(out.data)
