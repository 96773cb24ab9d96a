from django.db import models
from django.utils import timezone


class Upstream(models.Model):
    """A vLLM server behind /v1, as the gateway last saw it. Written by the gateway, read by training/ops."""

    url = models.CharField(max_length=300, unique=True)
    base_model = models.CharField(max_length=200)
    max_adapters = models.PositiveIntegerField(default=8)
    healthy = models.BooleanField(default=False)
    last_checked = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["url"]

    def __str__(self) -> str:
        return self.url


class LoadedAdapter(models.Model):
    """Which upstream holds which adapter version, so promotion can load the next one and drain the old."""

    upstream = models.ForeignKey(Upstream, on_delete=models.CASCADE, related_name="loaded_adapters")
    adapter_name = models.CharField(max_length=100)
    adapter_version = models.ForeignKey(
        "adapters.AdapterVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="loaded_on"
    )
    loaded_at = models.DateTimeField(default=timezone.now)
    last_used_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["upstream", "adapter_name"]
        constraints = [
            models.UniqueConstraint(fields=["upstream", "adapter_name"], name="one_row_per_upstream_adapter"),
        ]

    def __str__(self) -> str:
        return f"{self.adapter_name}@{self.upstream_id}"
