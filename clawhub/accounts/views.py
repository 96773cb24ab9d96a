"""Server-rendered pages for sign-up, sign-in, passwords, email verification and the audit log."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import update_session_auth_hash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.utils.http import url_has_allowed_host_and_scheme
from django.views.decorators.http import require_http_methods, require_POST

from clawhub.accounts import selectors, services
from clawhub.accounts.forms import (
    EmailForm,
    LoginForm,
    PasswordChangeForm,
    SetPasswordForm,
    SignedUpLoginForm,
    SignupForm,
)
from clawhub.core.api import client_ip
from clawhub.core.exceptions import (
    AuthenticationFailed,
    ClawHubError,
    NotFound,
    PermissionDenied,
    RateLimited,
    ValidationFailed,
)
from clawhub.core.forms import form_add_service_error

_RESET_SENT = "If an account exists for this address, we sent it a link to reset the password."
_VERIFICATION_SENT = "If this address has an account that still needs confirming, we sent it a new link."


@require_http_methods(["GET", "POST"])
def signup(request):
    if request.user.is_authenticated:
        return redirect("dashboard")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        email = selectors.email_normalize(form.cleaned_data["email"])
        try:
            services.user_signup(email=email, password=form.cleaned_data["new_password1"],
                                 display_name=form.cleaned_data["display_name"], ip=client_ip(request))
        except ClawHubError as exc:
            form_add_service_error(form, exc)
        else:
            # One answer whether the address was new or already had an account (whose owner got a mail):
            # nobody is signed in here, and the page says what to do in either case.
            if settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION:
                return render(request, "accounts/verify_sent.html", {"email": email})
            return render(request, "accounts/login.html", {"form": SignedUpLoginForm(email=email),
                                                           "signed_up": email})
    return render(request, "accounts/signup.html", {"form": form})


@require_http_methods(["GET", "POST"])
def login_view(request):
    next_url = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        next_url = ""
    if request.user.is_authenticated and request.method == "GET":
        return redirect(next_url or "dashboard")
    form = LoginForm(request.POST or None)
    status, retry_after, unverified = 200, None, False
    if request.method == "POST" and form.is_valid():
        try:
            _user, first_sign_in = services.user_login(request=request, **form.cleaned_data)
        except RateLimited as exc:
            form.add_error(None, exc.message)
            status, retry_after = 429, exc.retry_after
        except AuthenticationFailed as exc:
            form.add_error(None, exc.message)
            unverified = exc.code == "email_unverified"
        else:
            # A new account's first page is "connect OpenClaw" (a key, the config, a test request).
            return redirect(next_url or ("onboarding" if first_sign_in else "dashboard"))
    response = render(request, "accounts/login.html",
                      {"form": form, "next": next_url, "unverified": unverified}, status=status)
    if retry_after is not None:
        response["Retry-After"] = str(retry_after)
    return response


@require_POST
def logout_view(request):
    services.user_logout(request=request)
    return redirect(settings.LOGOUT_REDIRECT_URL)


@login_required
@require_POST
def logout_everywhere(request):
    services.user_sessions_end_all(user=request.user, actor=request.user, ip=client_ip(request),
                                   request=request)
    messages.success(request, "You are signed out on every device. API keys keep working; revoke them on "
                              "the keys page.")
    return redirect(settings.LOGOUT_REDIRECT_URL)


@login_required
@require_http_methods(["GET", "POST"])
def password_change(request):
    form = PasswordChangeForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            user = services.user_password_change(user=request.user,
                                                 old_password=form.cleaned_data["old_password"],
                                                 new_password=form.cleaned_data["new_password1"],
                                                 ip=client_ip(request))
        except (ValidationFailed, PermissionDenied) as exc:
            form_add_service_error(form, exc)
        else:
            update_session_auth_hash(request, user)
            messages.success(request, "Your password has been changed. Other sessions have been logged out.")
            return redirect("password_change")
    return render(request, "accounts/password_change.html", {"form": form})


@require_http_methods(["GET", "POST"])
def password_reset(request):
    form = EmailForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        services.password_reset_request(email=form.cleaned_data["email"], ip=client_ip(request))
        messages.info(request, _RESET_SENT)
        return redirect("password_reset")
    return render(request, "accounts/password_reset.html", {"form": form})


@require_http_methods(["GET", "POST"])
def password_reset_confirm(request, uidb64: str, token: str):
    if selectors.user_for_password_reset(uidb64=uidb64, token=token) is None:
        return render(request, "accounts/password_reset_confirm.html", {"invalid": True}, status=400)
    form = SetPasswordForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        try:
            services.password_reset_confirm(uidb64=uidb64, token=token,
                                            new_password=form.cleaned_data["new_password1"],
                                            revoke_keys=form.cleaned_data["revoke_keys"],
                                            ip=client_ip(request))
        except ValidationFailed as exc:
            form_add_service_error(form, exc)
        else:
            messages.success(request, "Your password has been set. You can log in now.")
            return redirect("login")
    return render(request, "accounts/password_reset_confirm.html", {"form": form})


@require_http_methods(["GET"])
def verify_email(request, token: str):
    try:
        services.user_email_verify(token=token, ip=client_ip(request),
                                   signed_in=request.user if request.user.is_authenticated else None)
    except ValidationFailed as exc:
        return render(request, "accounts/verify_email.html", {"error": exc.message, "form": EmailForm()},
                      status=400)
    messages.success(request, "Your email address is confirmed.")
    return redirect("dashboard" if request.user.is_authenticated else "login")


@require_POST
def verify_email_resend(request):
    form = EmailForm(request.POST)
    if form.is_valid():
        services.email_verification_resend(email=form.cleaned_data["email"], ip=client_ip(request))
    messages.info(request, _VERIFICATION_SENT)
    return redirect("login")


@login_required
@require_http_methods(["GET"])
def audit(request):
    group_slug = request.GET.get("group", "")
    everything = request.user.is_staff and request.GET.get("all") == "1"
    try:
        rows = selectors.audit_list(user=request.user, group_slug=group_slug, everything=everything)
    except NotFound as exc:
        raise Http404(exc.message) from exc
    except PermissionDenied as exc:
        raise DjangoPermissionDenied(exc.message) from exc
    page = Paginator(rows, 50).get_page(request.GET.get("page"))
    for row in page:
        row.visible_ip = row.ip if selectors.audit_ip_visible(row=row, viewer=request.user) else None
    return render(request, "accounts/audit.html", {
        "page": page,
        "groups": selectors.audit_groups_for(user=request.user),
        "group_slug": group_slug,
        "everything": everything,
    })
