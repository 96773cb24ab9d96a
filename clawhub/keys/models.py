from django.conf import settings
from django.db import models
from django.utils import timezone


def default_scopes() -> list[str]:
    from clawhub.keys.scopes import DEFAULT_SCOPES

    return list(DEFAULT_SCOPES)


class ApiKey(models.Model):
    """A client credential. Its id is stable across rotations; the secrets live in ApiKeySecret as digests."""

    owner = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_keys")
    # A key bound to a group trains (and is served) the group's adapter.
    group = models.ForeignKey("groups.Group", null=True, blank=True, on_delete=models.CASCADE,
                              related_name="api_keys")
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12)
    last4 = models.CharField(max_length=4)
    allowed_models = models.JSONField(default=list, blank=True,
                                      help_text="Model ids this key may use; empty = all.")
    rpm_limit = models.PositiveIntegerField(null=True, blank=True)
    tpm_limit = models.PositiveIntegerField(null=True, blank=True)
    concurrency_limit = models.PositiveIntegerField(null=True, blank=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    # What the key may do besides /v1 (clawhub/keys/scopes.py); "inference" alone unless the owner opted in.
    scopes = models.JSONField(default=default_scopes, blank=True)
    # Off: what this key sends is served (and stored, if its owner allows) but never trains (clawhub/review/).
    training_enabled = models.BooleanField(default=True)
    # Minted by the playground page for the signed-in user's browser (keys.services.playground_key_mint):
    # short-lived, inference only, absent from the key pages, and its turns are playground turns, which are
    # trained on only when the user rates them.
    playground = models.BooleanField(default=False)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-created_at", "-id"]

    def __str__(self) -> str:
        return f"{self.name} ({self.display})"

    @property
    def display(self) -> str:
        return f"{self.prefix}…{self.last4}"

    @property
    def is_active(self) -> bool:
        now = timezone.now()
        return self.revoked_at is None and (self.expires_at is None or self.expires_at > now)


class ApiKeySecret(models.Model):
    """One secret of a key, stored as its SHA-256 digest. Rotation adds a new one and ends the old one's
    life."""

    key = models.ForeignKey(ApiKey, on_delete=models.CASCADE, related_name="secrets")
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    # Null while current; set at rotation to the end of the grace window.
    valid_until = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"secret {self.pk} of key {self.key_id}"
