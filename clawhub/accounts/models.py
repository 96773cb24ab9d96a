from django.contrib.auth.base_user import AbstractBaseUser, BaseUserManager
from django.contrib.auth.models import PermissionsMixin
from django.db import models, transaction
from django.utils import timezone
from django.utils.crypto import salted_hmac


class UserManager(BaseUserManager):
    use_in_migrations = True

    def create_user(self, email: str, password: str | None = None, **fields):
        # Django's own tooling (createsuperuser, which validates the address itself; tests). Product code
        # calls accounts.services.user_create, which validates and refuses a taken address first.
        user = self.model(email=email, **fields)
        user.set_password(password) if password else user.set_unusable_password()
        return self.insert(user)

    def create_superuser(self, email: str, password: str | None = None, **fields):
        fields.update(is_staff=True, is_superuser=True)
        return self.create_user(email, password, **fields)

    @transaction.atomic
    def insert(self, user: "User") -> "User":
        """Saves a new user together with their personal tenant: every path that makes a user (sign-up, the
        Django admin's add form, createsuperuser) comes through here, so no user is ever without one."""
        from clawhub.tenants.models import Tenant  # tenants.models imports nothing of ours

        user.email = self.normalize_email(user.email or "").strip().lower()
        user.save(using=self._db)
        Tenant.objects.create(kind=Tenant.Kind.USER, user=user)
        return user


class User(AbstractBaseUser, PermissionsMixin):
    """A person. Signs in with email and password; owns API keys and a personal tenant."""

    email = models.EmailField(unique=True)
    display_name = models.CharField(max_length=150, blank=True)
    is_active = models.BooleanField(default=True)
    is_staff = models.BooleanField(default=False)
    date_joined = models.DateTimeField(default=timezone.now)
    email_verified_at = models.DateTimeField(null=True, blank=True)
    # Privacy switches (clawhub/review/): may my data train an adapter; may my turns be stored
    # at all (off: requests are served and metered, nothing of them is kept).
    training_enabled = models.BooleanField(default=True)
    store_turns = models.BooleanField(default=True)
    # "Sign out everywhere" bumps it: it is part of the session auth hash, so every session made before ends.
    session_epoch = models.PositiveIntegerField(default=0)

    objects = UserManager()

    USERNAME_FIELD = "email"
    EMAIL_FIELD = "email"
    REQUIRED_FIELDS: list[str] = []

    def __str__(self) -> str:
        return self.email

    @property
    def name(self) -> str:
        return self.display_name or self.email.split("@")[0]

    def _get_session_auth_hash(self, secret=None):
        # Django keys sessions to the password hash; the epoch lets "sign out everywhere" end them without a
        # password change. Epoch 0 keeps Django's own hash, so sessions made before this field stay valid.
        if not self.session_epoch:
            return super()._get_session_auth_hash(secret=secret)
        return salted_hmac("clawhub.accounts.User.session", f"{self.password}:{self.session_epoch}",
                           secret=secret, algorithm="sha256").hexdigest()


class AuditLog(models.Model):
    """Who changed what, when, and from where. Rows are never edited."""

    actor = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=64)
    target_type = models.CharField(max_length=32)
    target_id = models.CharField(max_length=64)
    target_repr = models.CharField(max_length=255, blank=True)
    # Scopes that decide who may read the row: the user it concerns, and the group it happened in.
    subject_user = models.ForeignKey(User, null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    group = models.ForeignKey("groups.Group", null=True, blank=True, on_delete=models.SET_NULL,
                              related_name="+")
    ip = models.GenericIPAddressField(null=True, blank=True)
    data = models.JSONField(default=dict, blank=True)
    created_at = models.DateTimeField(default=timezone.now, db_index=True)

    class Meta:
        ordering = ["-created_at", "-id"]
        indexes = [
            models.Index(fields=["actor", "-created_at"]),
            models.Index(fields=["subject_user", "-created_at"]),
            models.Index(fields=["group", "-created_at"]),
        ]

    def __str__(self) -> str:
        return f"{self.action} {self.target_type}:{self.target_id}"


class MailboxMessage(models.Model):
    """A mail the local mailbox kept instead of sending it (``clawhub.accounts.mailbox``: the embedded
    default, which has no mail server). Its reader is whoever is signed in with the address it went to."""

    to_email = models.EmailField(db_index=True)
    subject = models.CharField(max_length=255)
    body = models.TextField()
    sent_at = models.DateTimeField(default=timezone.now)

    class Meta:
        ordering = ["-sent_at", "-id"]

    def __str__(self) -> str:
        return f"{self.to_email}: {self.subject}"


class UserSession(models.Model):
    """A signed-in browser session, so its owner can see where they are signed in and end one. The session's
    data stays in Django's session store; this row says whose it is (a store keyed by session cannot be
    searched by user). Rows are written by ``clawhub.accounts.sessions`` and dropped when the session ends;
    one whose session ended otherwise (expired, a password change, "sign out everywhere") is dropped the
    next time the list is read."""

    user = models.ForeignKey(User, on_delete=models.CASCADE, related_name="+")
    session_key = models.CharField(max_length=40, unique=True)
    created_at = models.DateTimeField(default=timezone.now)
    last_seen_at = models.DateTimeField(default=timezone.now)
    ip = models.GenericIPAddressField(null=True, blank=True)
    user_agent = models.CharField(max_length=300, blank=True)

    class Meta:
        ordering = ["-last_seen_at", "-id"]
        indexes = [models.Index(fields=["user", "-last_seen_at"])]

    def __str__(self) -> str:
        return f"session of {self.user_id} since {self.created_at:%Y-%m-%d %H:%M}"
