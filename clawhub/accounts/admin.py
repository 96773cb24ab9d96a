from django.contrib import admin
from django.contrib.admin.forms import AdminAuthenticationForm
from django.core.exceptions import ValidationError

from clawhub.accounts.models import AuditLog
from clawhub.accounts.services import login_failed, login_recorded
from clawhub.accounts.throttle import login_succeeded, login_throttle_check
from clawhub.core.api import client_ip
from clawhub.core.exceptions import RateLimited


class ThrottledAdminLoginForm(AdminAuthenticationForm):
    """Django admin's login under the site login's brute-force throttle (clawhub.accounts.throttle): the same
    counters (per account and address, per account, per address), so guesses spread over both forms add up,
    and the same lock-out, the right password included."""

    def clean(self):
        email, ip = (self.cleaned_data.get("username") or "").strip().lower(), client_ip(self.request)
        user_agent = self.request.META.get("HTTP_USER_AGENT", "")[:300]
        try:
            login_throttle_check(email=email, ip=ip)
        except RateLimited as exc:
            raise ValidationError(exc.message, code="rate_limited") from None
        try:
            cleaned = super().clean()
        except ValidationError as exc:
            if getattr(exc, "code", None) == "invalid_login":
                login_failed(email=email, ip=ip, user_agent=user_agent)
            raise
        login_succeeded(email=email, ip=ip)
        login_recorded(user=self.get_user(), ip=ip, user_agent=user_agent, via="admin")
        return cleaned


admin.site.login_form = ThrottledAdminLoginForm


# The user admin is in clawhub/privacy/admin.py: deleting a user there goes through privacy's user_delete.


@admin.register(AuditLog)
class AuditLogAdmin(admin.ModelAdmin):
    """Read-only: audit rows are evidence and are never edited or deleted by hand."""

    list_display = [
        "created_at", "action", "actor", "subject_user", "group", "target_type", "target_repr", "ip",
    ]
    list_filter = ["action", "target_type"]
    search_fields = ["action", "target_repr", "actor__email", "subject_user__email", "group__slug"]
    list_select_related = ["actor", "subject_user", "group"]
    date_hierarchy = "created_at"

    def get_readonly_fields(self, request, obj=None):
        return [f.name for f in self.model._meta.fields]

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False
