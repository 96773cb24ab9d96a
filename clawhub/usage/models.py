from django.conf import settings
from django.db import models

# The counters of a row: capture adds to them, reads sum them.
SUMMED = (
    "requests", "errors", "prompt_tokens", "completion_tokens", "streams", "latency_ms_sum", "ttft_ms_sum",
)


class UsageDaily(models.Model):
    """What one key did with one model on one day (UTC). Rows only grow: capture adds each batch's sums."""

    day = models.DateField()
    key = models.ForeignKey("keys.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    # Denormalised from the key so that reads per user, group or tenant need no join.
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="+")
    group = models.ForeignKey(
        "groups.Group", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="+")
    model = models.CharField(max_length=100)
    requests = models.PositiveIntegerField(default=0)
    errors = models.PositiveIntegerField(default=0)
    prompt_tokens = models.PositiveBigIntegerField(default=0)
    completion_tokens = models.PositiveBigIntegerField(default=0)
    latency_ms_sum = models.FloatField(default=0)
    ttft_ms_sum = models.FloatField(default=0)  # over streams that reported a first token
    streams = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-day", "model"]
        constraints = [
            # The upsert's conflict target. Rows are only written with a key; a deleted key's rows keep NULL,
            # which never conflicts.
            models.UniqueConstraint(fields=["day", "key", "model"], name="one_usage_row_per_day_key_model"),
        ]
        indexes = [
            models.Index(fields=["user", "day"], name="usage_user_day"),
            models.Index(fields=["group", "day"], name="usage_group_day"),
            models.Index(fields=["tenant", "day"], name="usage_tenant_day"),
        ]

    def __str__(self) -> str:
        return f"{self.day} key {self.key_id} {self.model}"
