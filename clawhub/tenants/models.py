from django.db import models
from django.db.models import Q

from clawhub.tenants import naming


class Tenant(models.Model):
    """What an adapter belongs to: one user (personal adapter) or one group (shared adapter)."""

    class Kind(models.TextChoices):
        USER = "user"
        GROUP = "group"

    kind = models.CharField(max_length=8, choices=Kind.choices)
    user = models.OneToOneField(
        "accounts.User", null=True, blank=True, on_delete=models.CASCADE, related_name="tenant"
    )
    group = models.OneToOneField(
        "groups.Group", null=True, blank=True, on_delete=models.CASCADE, related_name="tenant"
    )
    created_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        constraints = [
            models.CheckConstraint(
                name="tenant_is_user_xor_group",
                condition=(Q(kind="user", user__isnull=False, group__isnull=True)
                           | Q(kind="group", group__isnull=False, user__isnull=True)),
            ),
        ]

    def __str__(self) -> str:
        return f"t{self.pk} {self.model_id}"

    @property
    def model_id(self) -> str:
        """The model id clients send for this tenant's adapter."""
        return naming.tenant_model_id(group_slug=self.group.slug if self.kind == self.Kind.GROUP else None)
