"""The group page: its members, invitations and each member's weight in the group's adapter. It shows review's
figures next to the group's own, so it lives with the pages that combine apps; its forms post to the group
pages in clawhub/groups/views.py.
"""

from django.conf import settings
from django.contrib.auth.decorators import login_required
from django.http import HttpRequest, HttpResponse
from django.shortcuts import render

from clawhub.groups import rules, selectors
from clawhub.groups.models import Role
from clawhub.groups.views import NEW_LINK_SESSION_KEY, group_or_404
from clawhub.tenants import naming
from clawhub.training.selectors import group_member_influence


@login_required
def group_detail(request: HttpRequest, slug: str) -> HttpResponse:
    group, role = group_or_404(request, slug)
    members = []
    for membership in selectors.group_members(group=group):
        target_role = Role(membership.role)
        is_self = membership.user_id == request.user.pk
        members.append({
            "membership": membership,
            "is_self": is_self,
            "role_choices": [] if is_self else [
                r for r in rules.GRANTABLE_ROLES if rules.can_change_role(role, target_role, r)
            ],
            "can_remove": not is_self and rules.can_remove(role, target_role),
            "can_receive_ownership": role == Role.OWNER and not is_self,
        })
    can_manage = rules.can_manage(role)
    influence_versions, influence = group_member_influence(group=group)
    return render(request, "groups/detail.html", {
        "group": group,
        "role": role,
        "is_owner": role == Role.OWNER,
        "can_manage": can_manage,
        "members": members,
        "invitations": selectors.group_invitations(group=group) if can_manage else [],
        "invite_roles": rules.grantable_roles(role),
        "new_invitation_link": request.session.pop(NEW_LINK_SESSION_KEY, None),
        "model_id": naming.group_model_id(group.slug),
        "influence_versions": influence_versions,
        "influence": influence,
        "influence_cap_pct": round(settings.CLAWHUB_INFLUENCE_CAP * 100),
    })
