from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone


class Judgment(models.Model):
    """What the judge made of one main turn: the PRM reward from its votes, and the hindsight hints it found.

    Written only by the judge task (``workers.tasks.judging``) through ``feedback.services``.
    """

    class Status(models.TextChoices):
        OK = "ok"
        FAILED = "failed"  # the judge could not be asked (after retries) or gave no usable answer

    turn = models.OneToOneField("conversations.Turn", on_delete=models.CASCADE, related_name="judgment")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="judgments")
    reward = models.SmallIntegerField(default=0, help_text="-1, 0 or 1: the majority of the valid votes.")
    votes = models.JSONField(default=list, help_text="Each PRM vote as parsed: -1, 0, 1 or null.")
    hints = models.JSONField(default=list, help_text="Accepted hints: candidates for on-policy distillation.")
    judge = models.CharField(max_length=20, help_text='The backend: "rule" or "llm".')
    prompt_version = models.CharField(max_length=40, blank=True)
    raw_outputs = models.JSONField(default=dict, help_text='{"prm": [texts], "hint": [texts], ...}')
    status = models.CharField(max_length=8, choices=Status.choices)
    error = models.TextField(blank=True)
    attempts = models.PositiveSmallIntegerField(default=0)
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        constraints = [
            models.CheckConstraint(name="judgment_reward_in_range", condition=Q(reward__in=(-1, 0, 1))),
        ]
        indexes = [models.Index(fields=["tenant", "-created_at"], name="judgment_tenant_recent")]

    def __str__(self) -> str:
        return f"judgment of turn {self.turn_id}: {self.reward:+d}"

    @property
    def votes_split(self) -> bool:
        """The valid votes disagree: a flag for review (the judge was unsure)."""
        return len({v for v in self.votes if v is not None}) > 1


class JudgeRules(models.Model):
    """A tenant's own rules for the rule judge, and which judge scores its turns."""

    class Backend(models.TextChoices):
        DEFAULT = "default"  # settings.CLAWHUB_JUDGE
        RULE = "rule"
        LLM = "llm"

    tenant = models.OneToOneField("tenants.Tenant", on_delete=models.CASCADE, related_name="judge_rules")
    judge = models.CharField(max_length=8, choices=Backend.choices, default=Backend.DEFAULT)
    # Each entry: a phrase ("not what I asked"), "re:<regular expression>", or {"name", "pattern", "regex"}.
    negative_patterns = models.JSONField(default=list, blank=True)
    positive_patterns = models.JSONField(default=list, blank=True)
    # Rule name -> hint text; "{feedback}" in the text is replaced with the user's next message.
    hint_templates = models.JSONField(default=dict, blank=True)
    extend_defaults = models.BooleanField(default=True, help_text="Add these rules to the built-in ones.")
    updated_at = models.DateTimeField(auto_now=True)
    updated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")

    class Meta:
        verbose_name_plural = "judge rules"

    def __str__(self) -> str:
        return f"judge rules of tenant {self.tenant_id}"
