"""Server-rendered pages for sign-up, sign-in, the account (sessions, passwords), email verification and the
audit log."""

from django.conf import settings
from django.contrib import messages
from django.contrib.auth import update_session_auth_hash
from django.contrib.auth.decorators import login_required
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.paginator import Paginator
from django.http import Http404
from django.shortcuts import redirect, render
from django.urls import reverse
from django.utils.http import url_has_allowed_host_and_scheme, urlencode
from django.views.decorators.http import require_GET, require_http_methods, require_POST

from clawhub.accounts import selectors, services
from clawhub.accounts.forms import (
    DisplayNameForm,
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


def _next_path(request) -> str:
    """Where the person was going (``?next=`` or the form's ``next``), if it is a page of this site; else "".
    Sign-up, log-in and the confirmation mail hand it on, so an invitation opened while signed out is where
    a new person ends up."""
    next_url = request.POST.get("next") or request.GET.get("next") or ""
    if not url_has_allowed_host_and_scheme(next_url, allowed_hosts={request.get_host()},
                                           require_https=request.is_secure()):
        return ""
    return next_url


def _with_next(url_name: str, next_path: str) -> str:
    url = reverse(url_name)
    return f"{url}?{urlencode({'next': next_path})}" if next_path else url


@require_http_methods(["GET", "POST"])
def signup(request):
    next_path = _next_path(request)
    if request.user.is_authenticated:
        return redirect(next_path or "dashboard")
    form = SignupForm(request.POST or None)
    if request.method == "POST" and form.is_valid():
        email = selectors.email_normalize(form.cleaned_data["email"])
        try:
            services.user_signup(email=email, password=form.cleaned_data["new_password1"],
                                 display_name=form.cleaned_data["display_name"], ip=client_ip(request),
                                 next_path=next_path)
        except ClawHubError as exc:
            form_add_service_error(form, exc)
        else:
            # One answer whether the address was new or already had an account (whose owner got a mail):
            # nobody is signed in here, and the page says what to do in either case.
            if settings.ACCOUNTS_REQUIRE_EMAIL_VERIFICATION:
                return render(request, "accounts/verify_sent.html", {"email": email, "next": next_path})
            return render(request, "accounts/login.html", {"form": SignedUpLoginForm(email=email),
                                                           "signed_up": email, "next": next_path})
    return render(request, "accounts/signup.html", {"form": form, "next": next_path})


@require_http_methods(["GET", "POST"])
def login_view(request):
    next_url = _next_path(request)
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
def account(request):
    """Who you are signed in as, where (each session, and "sign out everywhere"), your password, and the
    latest sign-ins to the account. A POST changes the display name."""
    form = DisplayNameForm(request.POST or None, initial={"display_name": request.user.display_name})
    if request.method == "POST" and form.is_valid():
        try:
            services.user_update(user=request.user, actor=request.user, ip=client_ip(request),
                                 display_name=form.cleaned_data["display_name"])
        except ValidationFailed as exc:
            form_add_service_error(form, exc)
        else:
            messages.success(request, "Your name has been saved.")
            return redirect("account")
    sessions = services.user_sessions_active(user=request.user)
    for row in sessions:
        row.device = selectors.device_label(row.user_agent)
        row.current = row.session_key == request.session.session_key
    sign_ins = selectors.audit_sign_ins(user=request.user)
    for row in sign_ins:
        row.visible_ip = row.ip if selectors.audit_ip_visible(row=row, viewer=request.user) else None
        row.device = selectors.device_label(row.data.get("user_agent", ""))
    return render(request, "accounts/account.html", {
        "form": form, "sessions": sessions, "sign_ins": sign_ins,
        "local_mailbox": selectors.local_mailbox_enabled(),
    }, status=400 if form.errors else 200)


@login_required
@require_POST
def account_session_end(request, session_id: int):
    try:
        services.user_session_end(user=request.user, session_id=session_id, actor=request.user,
                                  ip=client_ip(request))
    except NotFound as exc:
        messages.info(request, exc.message)
    else:
        messages.success(request, "That session is signed out. Whoever used it must log in again.")
    return redirect("account")


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
    next_path = _next_path(request)
    try:
        services.user_email_verify(token=token, ip=client_ip(request),
                                   signed_in=request.user if request.user.is_authenticated else None)
    except ValidationFailed as exc:
        return render(request, "accounts/verify_email.html",
                      {"error": exc.message, "form": EmailForm(), "next": next_path}, status=400)
    messages.success(request, "Your email address is confirmed.")
    if request.user.is_authenticated:
        return redirect(next_path or "dashboard")
    return redirect(_with_next("login", next_path))


@require_POST
def verify_email_resend(request):
    next_path = _next_path(request)
    form = EmailForm(request.POST)
    if form.is_valid():
        services.email_verification_resend(email=form.cleaned_data["email"], ip=client_ip(request),
                                           next_path=next_path)
    messages.info(request, _VERIFICATION_SENT)
    return redirect(_with_next("login", next_path))


@login_required
@require_POST
def verify_email_request(request):
    """The signed-in user asks for a confirmation link (the embedded default lets unconfirmed accounts log
    in, but an invitation sent to an address still wants that address confirmed)."""
    next_path = _next_path(request)
    if request.user.email_verified_at is not None:
        messages.info(request, "Your email address is already confirmed.")
    elif services.email_verification_request(user=request.user, ip=client_ip(request), next_path=next_path):
        where = (" It is in your mailbox on this site (this ClawHub sends no mail out)."
                 if selectors.local_mailbox_enabled() else "")
        messages.info(request, f"We sent a confirmation link to {request.user.email}.{where}")
    else:
        messages.error(request, "Too many mails were sent to this address lately; try again in an hour.")
    if selectors.local_mailbox_enabled():
        return redirect("mailbox")
    return redirect(next_path or "dashboard")


@login_required
@require_GET
def mailbox(request):
    """The local mailbox: the mails this site kept for the signed-in user's address (it sends none out)."""
    if not selectors.local_mailbox_enabled():
        raise Http404("This site sends its mail out; there is no local mailbox.")
    return render(request, "accounts/mailbox.html",
                  {"mails": selectors.mailbox_messages(user=request.user)})


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
        # What the pager keeps on its links.
        "query": urlencode({"group": group_slug, **({"all": "1"} if everything else {})}),
    })
