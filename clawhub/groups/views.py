"""Server-rendered pages for groups and invitations (the group page itself, which shows review's figures too,
is clawhub/web/group_page.py).

Every change is a POST (CSRF-checked) that calls a service and redirects back; a refusal from the service
comes back to the user as a message on the page.
"""

from collections.abc import Callable
from typing import Any

from django.contrib import messages
from django.contrib.auth.decorators import login_required
from django.http import Http404, HttpRequest, HttpResponse
from django.shortcuts import redirect, render
from django.views.decorators.http import require_http_methods, require_POST

from clawhub.accounts.selectors import local_mailbox_enabled
from clawhub.core.api import client_ip
from clawhub.core.exceptions import ClawHubError, NotFound
from clawhub.groups import selectors, services
from clawhub.groups.forms import GroupCreateForm, GroupRenameForm, InvitationForm, RoleForm, TransferForm
from clawhub.groups.models import Group, Role
from clawhub.keys.selectors import keys_for_group
from clawhub.tenants.access import group_access

# A link-only invitation's link is shown once: on the page rendered right after its creation, then popped.
NEW_LINK_SESSION_KEY = "groups:new_invitation_link"

_FAILED = object()


def group_or_404(request: HttpRequest, slug: str) -> tuple[Group, Role]:
    """The group and the user's role (tenants.access.group_access: non-members, staff included, get 404)."""
    try:
        access = group_access(actor=request.user, slug=slug)
    except NotFound as exc:
        raise Http404(exc.message) from None
    return access.group, access.group_role


def _member_or_404(group: Group, user_id: int):
    try:
        return selectors.group_member_get(group=group, user_id=user_id).user
    except NotFound as exc:
        raise Http404(exc.message) from None


def _attempt(request: HttpRequest, success: str, service: Callable[..., Any], **kwargs: Any) -> Any:
    """Calls a service as the signed-in user; a refusal becomes an error message and returns ``_FAILED``."""
    try:
        result = service(actor=request.user, ip=client_ip(request), **kwargs)
    except NotFound as exc:
        raise Http404(exc.message) from None
    except ClawHubError as exc:
        messages.error(request, exc.message)
        return _FAILED
    messages.success(request, success)
    return result


def _form_errors(request: HttpRequest, form) -> None:
    for field, errors in form.errors.items():
        label = "" if field == "__all__" else f"{form.fields[field].label or field.capitalize()}: "
        for error in errors:
            messages.error(request, f"{label}{error}")


@login_required
def group_list(request: HttpRequest) -> HttpResponse:
    form = GroupCreateForm(request.POST or None)
    if request.method == "POST":
        if form.is_valid():
            group = _attempt(request, "Group created.", services.group_create, **form.cleaned_data)
            if group is not _FAILED:
                return redirect("group_detail", slug=group.slug)
        else:
            _form_errors(request, form)
    return render(request, "groups/list.html", {
        "groups": selectors.groups_for_user(user=request.user),
        "form": form,
    })


@login_required
@require_POST
def group_rename(request: HttpRequest, slug: str) -> HttpResponse:
    group, _ = group_or_404(request, slug)
    form = GroupRenameForm(request.POST)
    if form.is_valid():
        _attempt(request, "Group renamed.", services.group_update, group=group,
                 name=form.cleaned_data["name"])
    else:
        _form_errors(request, form)
    return redirect("group_detail", slug=slug)


@login_required
@require_http_methods(["GET", "POST"])
def group_delete(request: HttpRequest, slug: str) -> HttpResponse:
    """GET: a page that says what deleting the group does and asks to confirm; its form's POST (with
    ``confirm=yes``) deletes. A POST without it changes nothing and is sent to that page, so a stray or
    scripted one-click post cannot delete a group."""
    group, role = group_or_404(request, slug)
    if request.method == "GET" or request.POST.get("confirm") != "yes":
        if role != Role.OWNER:  # the service says the same on the POST that would delete
            messages.error(request, "Only the owner of the group can delete it.")
            return redirect("group_detail", slug=slug)
        if request.method == "POST":
            return redirect("group_delete", slug=slug)
        return render(request, "groups/delete.html", {
            "group": group,
            "members": selectors.group_members(group=group).count(),
            "keys": keys_for_group(group=group, actor=request.user).filter(revoked_at__isnull=True).count(),
        })
    done = _attempt(request, f"Group {group.name} deleted; its keys were revoked.", services.group_delete,
                    group=group)
    return redirect("group_detail", slug=slug) if done is _FAILED else redirect("groups")


@login_required
@require_POST
def group_leave(request: HttpRequest, slug: str) -> HttpResponse:
    group, _ = group_or_404(request, slug)
    done = _attempt(request, f"You left {group.name}.", services.membership_leave, group=group)
    return redirect("group_detail", slug=slug) if done is _FAILED else redirect("groups")


@login_required
@require_POST
def group_transfer(request: HttpRequest, slug: str) -> HttpResponse:
    group, _ = group_or_404(request, slug)
    form = TransferForm(request.POST)
    if form.is_valid():
        new_owner = _member_or_404(group, form.cleaned_data["user_id"])
        _attempt(request, f"{new_owner.email} now owns the group; you are an admin.",
                 services.group_transfer_ownership, group=group, new_owner=new_owner)
    else:
        _form_errors(request, form)
    return redirect("group_detail", slug=slug)


@login_required
@require_POST
def group_invite(request: HttpRequest, slug: str) -> HttpResponse:
    group, _ = group_or_404(request, slug)
    form = InvitationForm(request.POST)
    if not form.is_valid():
        _form_errors(request, form)
        return redirect("group_detail", slug=slug)
    email = form.cleaned_data["email"]
    success = (f"Invitation sent to {email}." if email
               else "Invitation link created; copy it now, it is shown once.")
    if email and local_mailbox_enabled():
        success = (f"Invitation sent to {email}. This ClawHub sends no mail out: it waits under Mailbox "
                   f"here, for whoever signs in with that address; tell them to sign up.")
    created = _attempt(request, success, services.invitation_create, group=group, email=email,
                       role=form.cleaned_data["role"])
    if created is not _FAILED and not email:
        request.session[NEW_LINK_SESSION_KEY] = created[1]
    return redirect("group_detail", slug=slug)


@login_required
@require_POST
def group_invitation_revoke(request: HttpRequest, slug: str, invitation_id: int) -> HttpResponse:
    group, _ = group_or_404(request, slug)
    try:
        invitation = selectors.group_invitation_get(group=group, invitation_id=invitation_id)
    except NotFound as exc:
        raise Http404(exc.message) from None
    _attempt(request, "Invitation revoked.", services.invitation_revoke, invitation=invitation)
    return redirect("group_detail", slug=slug)


@login_required
@require_POST
def group_member_role(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    group, _ = group_or_404(request, slug)
    form = RoleForm(request.POST)
    if form.is_valid():
        _attempt(request, "Role changed.", services.membership_change_role, group=group,
                 user=_member_or_404(group, user_id), role=form.cleaned_data["role"])
    else:
        _form_errors(request, form)
    return redirect("group_detail", slug=slug)


@login_required
@require_POST
def group_member_remove(request: HttpRequest, slug: str, user_id: int) -> HttpResponse:
    group, _ = group_or_404(request, slug)
    leaving = user_id == request.user.pk
    success = f"You left {group.name}." if leaving else "Member removed; their group keys were revoked."
    done = _attempt(request, success, services.membership_remove, group=group,
                    user=_member_or_404(group, user_id))
    if done is not _FAILED and leaving:
        return redirect("groups")
    return redirect("group_detail", slug=slug)


@login_required
def invitation(request: HttpRequest, token: str) -> HttpResponse:
    """The page an invitation link opens: what it offers, and accept / decline buttons."""
    try:
        found = selectors.invitation_get_by_token(token=token)
    except NotFound as exc:
        raise Http404(exc.message) from None
    if request.method == "POST":
        action = request.POST.get("action")
        if action == "accept":
            if _attempt(request, f"Welcome to {found.group.name}.", services.invitation_accept,
                        token=token) is not _FAILED:
                return redirect("group_detail", slug=found.group.slug)
        elif action == "decline":
            declined = _attempt(request, "Invitation declined.", services.invitation_decline, token=token)
            if declined is not _FAILED:
                return redirect("groups")
        else:
            messages.error(request, "Choose accept or decline.")
        return redirect("invitation", token=token)
    wrong_email = bool(found.email) and found.email.lower() != request.user.email.lower()
    return render(request, "groups/invitation.html", {
        "invitation": found,
        "status": selectors.invitation_status(found),
        "wrong_email": wrong_email,
        # A seat meant for an address is taken once the address is confirmed (services.invitation_accept).
        "needs_confirmation": bool(found.email) and not wrong_email and not request.user.email_verified_at,
        "already_member": selectors.role_of(group=found.group, user=request.user) is not None,
    })
