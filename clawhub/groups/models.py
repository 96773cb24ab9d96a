from django.conf import settings
from django.db import models
from django.utils import timezone


class Role(models.TextChoices):
    """Group roles, weakest first. ``rank`` orders them for permission checks."""

    VIEWER = "viewer"
    MEMBER = "member"
    ADMIN = "admin"
    OWNER = "owner"

    @property
    def rank(self) -> int:
        return ROLE_RANK[self]


ROLE_RANK = {Role.VIEWER: 0, Role.MEMBER: 1, Role.ADMIN: 2, Role.OWNER: 3}


class Group(models.Model):
    """Users who share one adapter."""

    name = models.CharField(max_length=100)
    slug = models.SlugField(max_length=60, unique=True)
    created_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=8, choices=Role.choices)
    created_at = models.DateTimeField(default=timezone.now)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["group", "user"], name="one_membership_per_user_and_group"),
            models.UniqueConstraint(
                fields=["group"], condition=models.Q(role="owner"), name="one_owner_per_group"
            ),
        ]

    def __str__(self) -> str:
        return f"{self.user_id}@{self.group_id}:{self.role}"


class Invitation(models.Model):
    """An invitation by email (only that address may accept) or by link (anyone holding it, once)."""

    group = models.ForeignKey(Group, on_delete=models.CASCADE, related_name="invitations")
    email = models.EmailField(blank=True)
    role = models.CharField(max_length=8, choices=Role.choices, default=Role.MEMBER)
    token_digest = models.CharField(max_length=64, unique=True)
    invited_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+"
    )
    created_at = models.DateTimeField(default=timezone.now)
    expires_at = models.DateTimeField()
    accepted_by = models.ForeignKey(
        settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    accepted_at = models.DateTimeField(null=True, blank=True)
    declined_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)

    def __str__(self) -> str:
        return f"invitation {self.pk} to {self.group_id}"

    @property
    def is_open(self) -> bool:
        return (self.accepted_at is None and self.declined_at is None and self.revoked_at is None
                and self.expires_at > timezone.now())
