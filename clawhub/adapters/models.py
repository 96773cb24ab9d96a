from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from clawhub.tenants import naming


class AdapterVersion(models.Model):
    """One trained LoRA adapter of a tenant. Served to vLLM under a name unique to these weights.

    Lifecycle: candidate → evaluating → active | rejected; an active version becomes retired when another one
    is promoted (or rolled back to). A retired version drains first: ``drain_until`` says when the worker may
    unload it from the upstreams, ``unloaded_at`` when it did (see clawhub.adapters.services, "Hot swap").
    """

    class State(models.TextChoices):
        CANDIDATE = "candidate"
        EVALUATING = "evaluating"
        ACTIVE = "active"
        REJECTED = "rejected"
        RETIRED = "retired"

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="adapter_versions")
    version = models.PositiveIntegerField()
    parent = models.ForeignKey("self", null=True, blank=True, on_delete=models.SET_NULL,
                               related_name="children")
    artifact_path = models.CharField(max_length=500,
                                     help_text="PEFT adapter directory as the upstreams see it.")
    state = models.CharField(max_length=12, choices=State.choices, default=State.CANDIDATE)
    metrics = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    promoted_at = models.DateTimeField(null=True, blank=True)
    # The eval gate's mean rewards on the held-out prompts: this version's, and the version (or base model) it
    # was compared with. Details (per-prompt scores, margin, baseline name) are in metrics["eval"].
    eval_score = models.FloatField(null=True, blank=True)
    baseline_score = models.FloatField(null=True, blank=True)
    # The gate's decision ("promote", "reject", "not_enough_evidence", ...) and why, in words, for the
    # version page; the numbers behind it are in metrics["eval"].
    decision = models.CharField(max_length=24, blank=True)
    decision_reason = models.TextField(blank=True)
    # Re-driving what can be forgotten (the sweeper): when the gate started, how often the promotion was sent
    # again, why the last promotion attempt failed, and when a pinned tenant's passing candidate was held.
    evaluating_since = models.DateTimeField(null=True, blank=True)
    redrives = models.PositiveIntegerField(default=0)
    promotion_error = models.TextField(blank=True)
    held_at = models.DateTimeField(null=True, blank=True)
    retired_at = models.DateTimeField(null=True, blank=True)
    drain_until = models.DateTimeField(null=True, blank=True)
    unloaded_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["tenant", "-version"]
        constraints = [
            models.UniqueConstraint(fields=["tenant", "version"], name="one_row_per_tenant_version"),
            models.UniqueConstraint(fields=["tenant"], condition=Q(state="active"),
                                    name="one_active_per_tenant"),
        ]
        indexes = [
            # The unload sweep: retired versions still on the upstreams.
            models.Index(fields=["drain_until"], name="adapter_draining",
                         condition=Q(state="retired", unloaded_at__isnull=True, drain_until__isnull=False)),
        ]

    def __str__(self) -> str:
        return self.upstream_name

    @property
    def upstream_name(self) -> str:
        return naming.upstream_adapter_name(tenant_id=self.tenant_id, version=self.version)

    @property
    def draining(self) -> bool:
        return self.state == self.State.RETIRED and self.drain_until is not None and self.unloaded_at is None

    @property
    def display_state(self) -> str:
        return "draining" if self.draining else self.state


class AdapterPin(models.Model):
    """A tenant pinned to one version: trained candidates are evaluated but never promoted automatically."""

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, related_name="adapter_pin")
    version = models.ForeignKey(AdapterVersion, on_delete=models.CASCADE, related_name="+")
    pinned_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                  related_name="+")
    reason = models.CharField(max_length=300, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return f"tenant {self.tenant_id} pinned to {self.version}"


# --- the registry of which upstream holds which adapter (written by clawhub.adapters.registry) ------------


class Upstream(models.Model):
    """A vLLM server behind /v1, as the gateway last saw it. Written by the gateway, read by training/ops."""

    url = models.CharField(max_length=300, unique=True)
    base_model = models.CharField(max_length=200)
    max_adapters = models.PositiveIntegerField(default=8)
    healthy = models.BooleanField(default=False)
    last_checked = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "gateway_upstream"  # the table it had in the gateway app, kept when the model moved here
        ordering = ["url"]

    def __str__(self) -> str:
        return self.url


class LoadedAdapter(models.Model):
    """Which upstream holds which adapter version, so promotion can load the next one and drain the old."""

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="loaded_adapters")
    adapter_name = models.CharField(max_length=100)
    adapter_version = models.ForeignKey(
        AdapterVersion, null=True, blank=True, on_delete=models.SET_NULL, related_name="loaded_on"
    )
    loaded_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        db_table = "gateway_loadedadapter"  # likewise
        ordering = ["upstream", "adapter_name"]
        constraints = [
            models.UniqueConstraint(fields=["upstream", "adapter_name"], name="one_row_per_upstream_adapter"),
        ]

    def __str__(self) -> str:
        return f"{self.adapter_name}@{self.upstream_id}"
