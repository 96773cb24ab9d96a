from django.urls import path

from clawhub.accounts import views

urlpatterns = [
    path("signup/", views.signup, name="signup"),
    path("login/", views.login_view, name="login"),
    path("logout/", views.logout_view, name="logout"),
    path("logout/everywhere/", views.logout_everywhere, name="logout_everywhere"),
    path("account/", views.account, name="account"),
    path("account/sessions/<int:session_id>/end/", views.account_session_end, name="account_session_end"),
    path("account/password/", views.password_change, name="password_change"),
    path("password-reset/", views.password_reset, name="password_reset"),
    path("password-reset/<uidb64>/<token>/", views.password_reset_confirm, name="password_reset_confirm"),
    # Before the token route, which would otherwise swallow "resend".
    path("verify-email/resend/", views.verify_email_resend, name="verify_email_resend"),
    path("verify-email/request/", views.verify_email_request, name="verify_email_request"),
    path("verify-email/<str:token>/", views.verify_email, name="verify_email"),
    path("audit/", views.audit, name="audit"),
    path("mailbox/", views.mailbox, name="mailbox"),
]
