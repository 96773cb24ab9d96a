from django.urls import path

from clawhub.accounts import api

urlpatterns = [
    path("auth/csrf/", api.CsrfTokenApi.as_view(), name="api-auth-csrf"),
    path("auth/signup/", api.SignupApi.as_view(), name="api-auth-signup"),
    path("auth/login/", api.LoginApi.as_view(), name="api-auth-login"),
    path("auth/logout/", api.LogoutApi.as_view(), name="api-auth-logout"),
    path("auth/logout-everywhere/", api.LogoutEverywhereApi.as_view(), name="api-auth-logout-everywhere"),
    path("auth/password/change/", api.PasswordChangeApi.as_view(), name="api-auth-password-change"),
    path("auth/password/reset/", api.PasswordResetApi.as_view(), name="api-auth-password-reset"),
    path("auth/password/reset/confirm/", api.PasswordResetConfirmApi.as_view(),
         name="api-auth-password-reset-confirm"),
    path("auth/verify-email/", api.VerifyEmailApi.as_view(), name="api-auth-verify-email"),
    path("auth/verify-email/resend/", api.VerifyEmailResendApi.as_view(),
         name="api-auth-verify-email-resend"),
    path("me/", api.MeApi.as_view(), name="api-me"),
    path("audit/", api.AuditListApi.as_view(), name="api-audit"),
]
