from django.contrib import admin

from clawhub.review.models import ReviewPolicy, Sample


@admin.register(ReviewPolicy)
class ReviewPolicyAdmin(admin.ModelAdmin):
    """Where staff tune a tenant's guard thresholds; the mode itself is also set from the review console."""

    list_display = ("tenant", "mode", "new_key_age", "outlier_rate_diff", "dup_threshold", "updated_at")
    list_filter = ("mode",)
    raw_id_fields = ("tenant",)


@admin.register(Sample)
class SampleAdmin(admin.ModelAdmin):
    """Read-only: decisions go through the review console, which audits them."""

    list_display = ("id", "tenant", "user", "reward", "has_hint", "state", "created_at", "trained_at")
    list_filter = ("state", "reward", "has_hint")
    raw_id_fields = ("turn", "judgment", "tenant", "user", "key", "decided_by")

    def has_add_permission(self, request) -> bool:
        return False

    def has_change_permission(self, request, obj=None) -> bool:
        return False
