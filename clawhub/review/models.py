from datetime import timedelta

from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class ReviewPolicy(models.Model):
    """How a tenant's judged samples reach training, and the thresholds of its poisoning guards.

    A tenant without a row uses the defaults (``review.selectors.review_policy_for``): groups ``flagged``,
    personal tenants ``auto``.
    """

    class Mode(models.TextChoices):
        AUTO = "auto"  # approved unless flagged
        FLAGGED = "flagged"  # unflagged approved, flagged ones wait for a human
        MANUAL = "manual"  # every sample waits for a human

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, related_name="review_policy")
    mode = models.CharField(max_length=8, choices=Mode.choices)
    new_key_age = models.DurationField(default=timedelta(hours=24),
                                       help_text="Feedback through a younger key is flagged.")
    outlier_window = models.DurationField(default=timedelta(days=7))
    outlier_rate_diff = models.FloatField(default=0.4)
    outlier_min_samples = models.PositiveIntegerField(default=5)
    outlier_volume_factor = models.FloatField(default=3.0)
    dup_window = models.DurationField(default=timedelta(hours=24))
    dup_threshold = models.PositiveIntegerField(
        default=3, help_text="The n-th identical next state from one user within the window is flagged.")
    # Consensus guard (groups, review.flags.group_verdicts): over the outlier window, two members disagree
    # when the share of their comparable replies scored the opposite way is above the threshold at 95 %
    # confidence; a member who disagrees with most of the others is flagged.
    consensus_threshold = models.FloatField(default=0.5)
    consensus_min_pairs = models.PositiveIntegerField(
        default=6, help_text="Comparable replies two members need before the consensus guard judges them.")
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"review policy of tenant {self.tenant_id}: {self.mode}"


class Sample(models.Model):
    """A judged main turn that could teach the tenant's adapter something, and where it stands in review."""

    class State(models.TextChoices):
        PENDING = "pending"
        APPROVED = "approved"
        REJECTED = "rejected"
        DELETED = "deleted"  # by its user: never offered for training again

    turn = models.OneToOneField("conversations.Turn", on_delete=models.CASCADE, related_name="sample")
    judgment = models.OneToOneField("feedback.Judgment", on_delete=models.CASCADE, related_name="sample")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="samples")
    # The member whose turn it is (denormalised from the turn for the per-member cap and the outlier guard).
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="samples")
    key = models.ForeignKey("keys.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    reward = models.SmallIntegerField()
    has_hint = models.BooleanField(default=False)
    state = models.CharField(max_length=8, choices=State.choices)
    flags = models.JSONField(default=list, blank=True, help_text='[{"code", "detail"}, …]')
    # sha256 of the normalised next-state text: the near-duplicate guard looks it up by user.
    next_state_digest = models.CharField(max_length=64, blank=True)
    # The reply's style signature (review.flags.reply_style): what the consensus guard compares members on.
    reply_style = models.CharField(max_length=64, blank=True)
    # Set when a training run claims the sample (training.influence): its estimated advantage mass and the
    # loss weight that keeps each member's share of an update's (and a window of updates') mass bounded.
    advantage_mass = models.FloatField(default=0.0)
    train_weight = models.FloatField(default=1.0)
    decided_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    decided_at = models.DateTimeField(null=True, blank=True)
    reason = models.TextField(blank=True)
    # The claim: set when a training run claims the sample, cleared when the run gives it back (a failure, a
    # rejected candidate, a sample the trainer dropped). Deleting a run deletes no sample, only its claim.
    training_run = models.ForeignKey("training.TrainingRun", null=True, blank=True, on_delete=models.SET_NULL,
                                     related_name="samples")
    trained_at = models.DateTimeField(null=True, blank=True)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            # samples_for_training: a tenant's approved, unclaimed samples, oldest first.
            models.Index(fields=["tenant", "created_at", "id"], name="sample_trainable",
                         condition=Q(state="approved", trained_at__isnull=True,
                                     training_run_id__isnull=True)),
            # The review console: a tenant's samples by state, newest first.
            models.Index(fields=["tenant", "state", "-created_at"], name="sample_tenant_state"),
            # A user's own samples, and the outlier guard's window per member.
            models.Index(fields=["user", "-created_at"], name="sample_user_recent"),
            models.Index(fields=["user", "next_state_digest", "created_at"], name="sample_user_dup"),
        ]

    def __str__(self) -> str:
        return f"sample {self.pk} ({self.state}, reward {self.reward:+d})"

    @property
    def flag_codes(self) -> list[str]:
        return [f.get("code", "") for f in self.flags or []]

    @property
    def claimed(self) -> bool:
        return self.training_run_id is not None or self.trained_at is not None
