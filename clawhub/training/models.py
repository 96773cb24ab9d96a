from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workers.trainer.registry import backend_names


class Method(models.TextChoices):
    RL = "rl"  # Binary RL: A = r
    OPD = "opd"  # on-policy distillation from the hinted teacher
    COMBINE = "combine"  # w_opd * OPD + w_rl * r


# Every backend in workers.trainer.registry: Backend.LOCAL, .TINKER, .FIREWORKS, …
Backend = models.TextChoices("Backend", [(name.upper(), name) for name in backend_names()])


class TrainingSettings(models.Model):
    """A tenant's training choices. Without a row the site defaults apply
    (selectors.training_settings_for)."""

    tenant = models.OneToOneField(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="training_settings"
    )
    method = models.CharField(max_length=8, choices=Method.choices, default=Method.COMBINE)
    # TrainConfig fields on top of CLAWHUB_TRAIN_DEFAULTS (lr, epochs, lora_r, ...); validated on save.
    overrides = models.JSONField(default=dict, blank=True)
    # Empty = the site's CLAWHUB_TRAIN_BACKEND. Only site staff choose (it decides where data and money go).
    backend = models.CharField(max_length=12, choices=Backend.choices, blank=True)
    batch_size = models.PositiveIntegerField(
        null=True, blank=True, help_text="Empty = CLAWHUB_TRAINING_BATCH_SIZE."
    )
    auto_start = models.BooleanField(default=True, help_text="Start a run when a full batch is approved.")
    updated_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"training settings of tenant {self.tenant_id}"


class TrainingRun(models.Model):
    """One LoRA update of a tenant's adapter from a claimed batch of approved samples.

    The claim is ``review.Sample.training_run`` (``run.samples``): the samples this run holds now, held-out
    ones included. ``sample_ids`` is the batch as the run took it, in training order: a redelivered task
    trains the same batch, and a run that gave its samples back (failed, cancelled, rejected) still says
    which samples it had. Readers of "what does this run hold" go through the foreign key.
    """

    class State(models.TextChoices):
        QUEUED = "queued"
        RUNNING = "running"
        SUCCEEDED = "succeeded"
        FAILED = "failed"
        CANCELLED = "cancelled"

    OPEN_STATES = (State.QUEUED, State.RUNNING)

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="training_runs")
    backend = models.CharField(max_length=12, choices=Backend.choices)
    method = models.CharField(max_length=8, choices=Method.choices)
    config = models.JSONField(default=dict, help_text="TrainConfig: site defaults merged with the tenant's.")
    base_model = models.CharField(max_length=500)
    state = models.CharField(max_length=10, choices=State.choices, default=State.QUEUED)
    started_by = models.ForeignKey(
        settings.AUTH_USER_MODEL,
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="+",
        help_text="Empty: started automatically.",
    )
    task_id = models.CharField(max_length=64, blank=True)
    workdir = models.CharField(max_length=500, blank=True)
    # The version this run continues, fixed when the run starts training (parent_resolved_at), not when it
    # claims: a batch claimed while the previous candidate was still on its way must train from that one.
    parent_version = models.ForeignKey(
        "adapters.AdapterVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    parent_resolved_at = models.DateTimeField(null=True, blank=True)
    adapter_version = models.OneToOneField(
        "adapters.AdapterVersion",
        null=True,
        blank=True,
        on_delete=models.SET_NULL,
        related_name="training_run",
    )
    sample_ids = models.JSONField(default=list, blank=True)
    # Claimed with the batch but never trained on: the eval gate's held-out slice
    # (CLAWHUB_GATE_HOLDOUT_EVERY).
    heldout_ids = models.JSONField(default=list, blank=True)
    # Progress, as of the last optimizer step.
    step = models.PositiveIntegerField(default=0)
    loss = models.FloatField(null=True, blank=True)
    mean_reward = models.FloatField(null=True, blank=True)
    mean_advantage = models.FloatField(null=True, blank=True)
    tokens = models.BigIntegerField(default=0)
    seconds = models.FloatField(default=0.0)
    metrics = models.JSONField(default=list, blank=True, help_text="StepMetrics of every step, in order.")
    dropped = models.JSONField(default=list, blank=True, help_text='[{"sample_id", "reason"}, …]')
    sample_notes = models.JSONField(
        default=dict,
        blank=True,
        help_text='Per trained sample id: {"pi_old": "recorded" or "recomputed: <why>", "version_lag": how '
        'many versions behind the parent the serving version was, "sampler": [temperature, top_p, top_k]}.',
    )
    attempts = models.PositiveIntegerField(default=0, help_text="Deliveries of the task (2+ = resumed).")
    resumed_from_step = models.PositiveIntegerField(null=True, blank=True)
    error = models.TextField(blank=True)

    class Failure(models.TextChoices):
        NONE = ""
        ERROR = "error"
        TIMEOUT = "timeout"  # past CLAWHUB_TRAIN_SOFT_TIME_LIMIT: counted against the samples it claimed

    failure = models.CharField(max_length=8, choices=Failure.choices, blank=True, default="")
    remote_ids = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now)
    started_at = models.DateTimeField(null=True, blank=True)
    finished_at = models.DateTimeField(null=True, blank=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            # At most one run per tenant at a time; run_start also locks the tenant row, this is the backstop.
            models.UniqueConstraint(
                fields=["tenant"],
                condition=Q(state__in=["queued", "running"]),
                name="one_open_run_per_tenant",
            ),
        ]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="run_tenant_recent")]

    def __str__(self) -> str:
        return f"run {self.pk} of tenant {self.tenant_id} ({self.state})"

    @property
    def is_open(self) -> bool:
        return self.state in self.OPEN_STATES
