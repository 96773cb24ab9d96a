from django.conf import settings
from django.db import models
from django.db.models import Q
from django.utils import timezone

from workers.judge.registry import judge_names


class Judgment(models.Model):
    """What the judge made of one main turn: the PRM reward from its votes, and the hindsight hints it found.

    Written only by the judge task (``workers.tasks.judging``) through ``feedback.services``.
    """

    class Status(models.TextChoices):
        OK = "ok"
        FAILED = "failed"  # the judge could not be asked (after retries) or gave no usable answer
        # A person rated the turn before the judge got to it: the row exists so that the turn's sample can;
        # the judge fills it in when it runs (``judgment_store`` replaces it like a failed one).
        AWAITING = "awaiting"

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

    # "default" (settings.CLAWHUB_JUDGE), then every judge in workers.judge.registry: Backend.RULE, .LLM, …
    Backend = models.TextChoices("Backend",
                                 [("DEFAULT", "default"), *((name.upper(), name) for name in judge_names())])

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


class ExplicitFeedback(models.Model):
    """What a person (or their script) said about one main turn themselves: a thumb, a 1–5 score, a comment,
    a corrected reply, or several of these. One per turn: rating again updates it.

    It outranks the judge: the turn's sample takes its reward from here when it has one (the judge's votes
    stay on the Judgment, both are shown), its comment becomes the sample's hint, and a demonstration turns
    the sample into one that trains the corrected reply (``review.selectors.sample_signal``).
    """

    class Thumb(models.TextChoices):
        UP = "up"
        DOWN = "down"

    class Source(models.TextChoices):
        API = "api"  # the REST API, signed in or with an admin-scope key
        GATEWAY = "gateway"  # /v1/feedback with the key that served the turn
        WEB = "web"  # the conversation page

    turn = models.OneToOneField("conversations.Turn", on_delete=models.CASCADE,
                                related_name="explicit_feedback")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="explicit_feedback")
    rated_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                 related_name="+")
    key = models.ForeignKey("keys.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+",
                            help_text="The key the rating came through, if any.")
    source = models.CharField(max_length=8, choices=Source.choices)
    thumb = models.CharField(max_length=4, choices=Thumb.choices, blank=True)
    score = models.PositiveSmallIntegerField(null=True, blank=True, help_text="1 (bad) to 5 (good).")
    comment = models.TextField(blank=True)
    demonstration = models.TextField(blank=True, help_text="The reply the user wanted instead.")
    created_at = models.DateTimeField(default=timezone.now)
    updated_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-updated_at", "-id"]
        constraints = [
            models.CheckConstraint(name="explicit_score_1_to_5",
                                   condition=Q(score__isnull=True) | Q(score__gte=1, score__lte=5)),
        ]
        indexes = [models.Index(fields=["tenant", "-updated_at"], name="explicit_tenant_recent")]

    def __str__(self) -> str:
        return f"explicit feedback on turn {self.turn_id}"

    @property
    def reward(self) -> int | None:
        """-1, 0 or +1 from the thumb, else from the score (1–2 bad, 3 neither, 4–5 good); None when the
        person gave neither (a comment or a demonstration alone leaves the judge's reward standing)."""
        if self.thumb:
            return 1 if self.thumb == self.Thumb.UP else -1
        if self.score is not None:
            return -1 if self.score <= 2 else (0 if self.score == 3 else 1)
        return None
