"""Reads for the onboarding checklist: how far a new user's personal tenant has come, from a key to a first
training run. Each step is one indexed existence query, so the page can poll it every few seconds."""

from dataclasses import dataclass

from django.apps import apps
from django.urls import reverse

from clawhub.conversations.models import Turn
from clawhub.feedback.models import Judgment
from clawhub.keys.selectors import keys_for_user
from clawhub.tenants.selectors import tenant_for_user
from clawhub.usage.models import UsageDaily


@dataclass(frozen=True)
class Step:
    slug: str
    label: str
    done: bool
    waiting: str  # what happens next while not done
    link: str = ""


@dataclass(frozen=True)
class Checklist:
    steps: list[Step]

    @property
    def complete(self) -> bool:
        return all(step.done for step in self.steps)


def onboarding_checklist(*, user) -> Checklist:
    """The steps in order; each says whether the user's personal tenant has reached it."""
    tenant = tenant_for_user(user=user)
    main_turns = Turn.objects.filter(tenant=tenant, turn_type=Turn.Type.MAIN)
    run_exists = False
    if apps.is_installed("clawhub.training"):
        from clawhub.training.models import TrainingRun

        run_exists = TrainingRun.objects.filter(tenant=tenant).exists()
    return Checklist(steps=[
        Step("key", "Create an API key", keys_for_user(user=user).filter(group__isnull=True).exists(),
             "Create the key OpenClaw will use.", reverse("keys")),
        # Any request counts, the test request (a side turn) and failed ones too: the key reached ClawHub.
        Step("request", "Send a first request", UsageDaily.objects.filter(user=user, requests__gt=0).exists(),
             "Press “Send a test request”, or start OpenClaw.", reverse("usage")),
        Step("turn", "Your agent's first turn is recorded", main_turns.exists(),
             "Chat with your agent: each reply in the conversation is a turn ClawHub can learn from.",
             reverse("conversations")),
        Step("judgment", "The first turn is judged", Judgment.objects.filter(tenant=tenant).exists(),
             "A turn is judged once the next message (yours or a tool's) shows how it went.",
             reverse("conversations")),
        Step("training", "The first training run starts", run_exists,
             "A run starts when enough judged turns are approved for a batch.", reverse("training")),
    ])
