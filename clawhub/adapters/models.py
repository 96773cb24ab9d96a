from django.db import models
from django.db.models import Q
from django.utils import timezone


class AdapterVersion(models.Model):
    """One trained LoRA adapter of a tenant. Served to vLLM under a name unique to these weights."""

    class State(models.TextChoices):
        CANDIDATE = "candidate"
        EVALUATING = "evaluating"
        ACTIVE = "active"
        REJECTED = "rejected"
        RETIRED = "retired"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="adapter_versions")
    version = models.PositiveIntegerField()
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children")
    artifact_path = models.CharField(max_length=500, help_text="PEFT adapter directory as the upstreams see it.")
    state = models.CharField(max_length=12, choices=State.choices, default=State.CANDIDATE)
    metrics = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    promoted_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "version"], name="one_row_per_tenant_version"),
            models.UniqueConstraint(fields=["tenant"], condition=Q(state="active"), name="one_active_per_tenant"),
        ]

    def __str__(self) -> str:
        return self.upstream_name

    @property
    def upstream_name(self) -> str:
        # Never reuse a name for different weights: vLLM caches by name (stale prefix cache otherwise).
        return f"t{self.tenant_id}-v{self.version}"
