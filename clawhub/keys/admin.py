"""Admin for API keys. Secrets (even their digests) are never shown; ApiKeySecret is deliberately not
registered and has no inline. Changes go through the services, so the admin only revokes."""

from django.contrib import admin, messages

from clawhub.keys.models import ApiKey
from clawhub.keys.services import key_revoke

_FIELDS = ("name", "display", "owner", "group", "allowed_models", "rpm_limit", "tpm_limit",
           "concurrency_limit", "created_at", "last_used_at", "expires_at", "revoked_at", "is_active")


@admin.register(ApiKey)
class ApiKeyAdmin(admin.ModelAdmin):
    list_display = ("name", "display", "owner", "group", "created_at", "last_used_at", "expires_at",
                    "revoked_at")
    list_filter = ("revoked_at", "created_at")
    list_select_related = ("owner", "group")
    search_fields = ("name", "prefix", "owner__email", "group__slug")
    fields = _FIELDS
    readonly_fields = _FIELDS
    actions = ["revoke_keys"]

    def has_add_permission(self, request) -> bool:
        # A key made here would have no one to show its secret to.
        return False

    @admin.display(boolean=True)
    def is_active(self, obj: ApiKey) -> bool:
        return obj.is_active

    @admin.action(description="Revoke selected keys")
    def revoke_keys(self, request, queryset):
        for key in queryset.select_related("owner", "group"):
            key_revoke(key=key, actor=request.user, reason="revoked in the admin")
        messages.success(request, f"Revoked {queryset.count()} key(s).")
