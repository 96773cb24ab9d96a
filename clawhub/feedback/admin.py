from django.contrib import admin

from clawhub.feedback.models import JudgeRules, Judgment


@admin.register(Judgment)
class JudgmentAdmin(admin.ModelAdmin):
    list_display = (
        "id", "turn", "tenant", "reward", "judge", "prompt_version", "status", "attempts", "created_at",
    )
    list_filter = ("status", "judge", "reward")
    raw_id_fields = ("turn", "tenant")
    readonly_fields = ("created_at", "updated_at")


@admin.register(JudgeRules)
class JudgeRulesAdmin(admin.ModelAdmin):
    list_display = ("tenant", "judge", "extend_defaults", "updated_at", "updated_by")
    raw_id_fields = ("tenant", "updated_by")
