from django.conf import settings
from django.db import models
from django.db.models import Q


class Session(models.Model):
    """One conversation of one user with one tenant's model, named by the client or inferred by ClawHub."""

    class CloseReason(models.TextChoices):
        DONE = "done"  # the client said so (X-Session-Done / session_done)
        IDLE = "idle"  # no turn for CONVERSATION_IDLE_TIMEOUT

    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="sessions")
    key = models.ForeignKey("keys.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="sessions")
    # The client's session id, or a generated one ("inf-…") for sessions ClawHub inferred from the messages.
    external_id = models.CharField(max_length=200)
    inferred = models.BooleanField(default=False)
    started_at = models.DateTimeField()
    last_activity_at = models.DateTimeField()
    closed_at = models.DateTimeField(null=True, blank=True)
    close_reason = models.CharField(max_length=8, choices=CloseReason.choices, blank=True)
    # Turns so far, so the next turn's index: capture numbers turns under the session's row lock.
    turn_count = models.PositiveIntegerField(default=0)

    class Meta:
        ordering = ["-last_activity_at", "-id"]
        constraints = [
            models.UniqueConstraint(
                fields=["tenant", "external_id"], name="one_session_per_tenant_external_id"
            ),
        ]
        indexes = [
            models.Index(fields=["user", "-last_activity_at"], name="session_user_recent"),
            # The idle sweep reads only open sessions.
            models.Index(
                fields=["last_activity_at"], condition=Q(closed_at__isnull=True), name="session_open_idle"
            ),
        ]

    def __str__(self) -> str:
        return f"session {self.external_id}"


class Turn(models.Model):
    """One request served by the gateway and what came back, linked to what the user or a tool did next."""

    class Type(models.TextChoices):
        MAIN = "main"  # part of the user's dialogue: judged and trained on
        SIDE = "side"  # heartbeats, memory flushes and other housekeeping: served and logged, never trained
        # A prompt tried in the playground (a playground key's turns): never judged, trained on only once the
        # user rates it.
        PLAYGROUND = "playground"

    class Status(models.TextChoices):
        COMPLETE = "complete"
        CUT = "cut"  # the stream ended early
        FAILED = "failed"

    class Ended(models.TextChoices):
        """How the reply ended. Only stop and tool_calls are whole replies; the others are cut turns, which
        are kept out of judging (and so out of training) unless the tenant includes ``length`` ones."""

        STOP = "stop"
        TOOL_CALLS = "tool_calls"
        LENGTH = "length"  # max_tokens (or the context) ran out
        CLIENT_DISCONNECT = "client_disconnect"
        UPSTREAM_ERROR = "upstream_error"  # the model server failed, before or during the reply

    class Link(models.TextChoices):
        """What a main turn is to the turn whose prompt + reply its request extends (``parent``)."""

        START = "", "start"  # extends no stored turn
        NEXT = "next"  # its request is the parent's next state
        REGENERATE = "regenerate"  # repeats the prompt of ``regenerate_of`` (a retry): a sibling
        FORK = "fork"  # extends the parent after another turn already did: a branch

    class Api(models.TextChoices):
        """The API the client spoke. Messages and Responses requests are served through the chat route (their
        ``route`` is chat: the request is stored as the chat request it was translated to)."""

        CHAT = "chat", "Chat Completions"
        COMPLETIONS = "completions", "Completions"
        MESSAGES = "messages", "Anthropic Messages"
        RESPONSES = "responses", "OpenAI Responses"

    session = models.ForeignKey(Session, on_delete=models.CASCADE, related_name="turns")
    tenant = models.ForeignKey("tenants.Tenant", on_delete=models.CASCADE, related_name="turns")
    key = models.ForeignKey("keys.ApiKey", null=True, blank=True, on_delete=models.SET_NULL, related_name="+")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="turns")
    index = models.PositiveIntegerField(help_text="Position in the session, from 0.")
    turn_type = models.CharField(max_length=10, choices=Type.choices)
    request_id = models.CharField(max_length=100, unique=True)
    route = models.CharField(max_length=16)
    api = models.CharField(max_length=16, choices=Api.choices, default=Api.CHAT)
    model = models.CharField(max_length=100, help_text="The client-facing model id.")
    upstream_model = models.CharField(max_length=200, blank=True)
    adapter_version = models.ForeignKey(
        "adapters.AdapterVersion", null=True, blank=True, on_delete=models.SET_NULL, related_name="turns"
    )
    request = models.JSONField(
        default=dict,
        help_text="tools and sampling params (or the prompt) as sent; the messages are stored apart, see "
        "messages_added. Rows written before that keep their messages here.",
    )
    # The messages, O(n) per session: the first ``messages_shared`` messages of ``prompt_base``'s prompt, then
    # ``messages_added`` (a JSON array, kept as text so that it reads back exactly as sent). Rebuilt by
    # ``selectors.turn_messages``.
    prompt_base = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="+"
    )
    messages_shared = models.PositiveIntegerField(default=0)
    messages_added = models.TextField(blank=True)
    # vLLM's prompt token ids, the same way: ``prompt_token_ids_shared`` ids of prompt_base's prompt + reply
    # ids, then ``prompt_token_ids_added`` (little-endian uint32). ``prompt_token_count`` is None when the
    # upstream returned no ids (the trainer then re-renders the prompt).
    prompt_token_count = models.PositiveIntegerField(null=True, blank=True)
    prompt_token_ids_shared = models.PositiveIntegerField(default=0)
    prompt_token_ids_added = models.BinaryField(null=True, blank=True)
    response = models.JSONField(default=list, help_text="choices as the client saw them.")
    token_ids = models.JSONField(null=True, blank=True)
    logprobs = models.JSONField(null=True, blank=True)
    # How the reply was sampled (conversations.sampling.turn_sampling): temperature, top_p, top_k (the
    # request's or the served defaults), the server's logprobs_mode, and which values were defaulted. {} on
    # rows written before it was recorded (the trainer then treats the log-probs' mode as unknown).
    sampling = models.JSONField(default=dict, blank=True)
    prompt_tokens = models.PositiveIntegerField(default=0)
    completion_tokens = models.PositiveIntegerField(default=0)
    usage_estimated = models.BooleanField(default=False)
    status = models.CharField(max_length=8, choices=Status.choices)
    http_status = models.PositiveSmallIntegerField()
    latency_ms = models.FloatField()
    ttft_ms = models.FloatField(null=True, blank=True)
    error = models.TextField(blank=True)
    created_at = models.DateTimeField(help_text="When the request started.")
    # What followed this turn, always a list of messages: the newest user message, or the tool results that
    # answered this turn's tool calls (with a user message after them, if there was one).
    next_state = models.JSONField(null=True, blank=True)
    next_state_at = models.DateTimeField(null=True, blank=True)
    closed_without_next = models.BooleanField(default=False)
    # sha256 over the canonical request messages plus this turn's reply as the client resends it: a later
    # request whose messages start with exactly that continues this turn's session (conversations.identity).
    continuation_hash = models.CharField(max_length=64, blank=True)
    # The same without the user messages after the first of the request's trailing ones (a retry's
    # instruction): what OpenClaw resends after a served retry. "" unless the request ended with two or more.
    continuation_hash_without_retry = models.CharField(max_length=64, blank=True)
    # The canonical request messages alone (a regenerate repeats them), and the continuation hash of the
    # newest prefix ending with an assistant message (the turn this one continues, stored or still to come).
    prompt_hash = models.CharField(max_length=64, blank=True)
    parent_hash = models.CharField(max_length=64, blank=True)
    parent = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="children"
    )
    link = models.CharField(max_length=10, choices=Link.choices, blank=True, default="")
    regenerate_of = models.ForeignKey(
        "self", null=True, blank=True, on_delete=models.SET_NULL, related_name="regenerates"
    )
    # What this turn's request adds after the conversation's last reply: the parent's next state when this
    # turn is its first continuation.
    follows = models.JSONField(null=True, blank=True)
    ended = models.CharField(max_length=17, choices=Ended.choices, blank=True)
    # The output limit the gateway sent upstream when the client's max_tokens did not fit the context.
    clamped_max_tokens = models.PositiveIntegerField(null=True, blank=True)

    class Meta:
        ordering = ["session_id", "index"]
        constraints = [
            # Also serves as the (session, index) index.
            models.UniqueConstraint(fields=["session", "index"], name="one_turn_per_session_index"),
        ]
        # Capture reads the newest few turns per hash (conversations.capture.graph.LINK_ROWS): each hash index
        # ends with the id, so that read stays a short index scan however many turns share the hash.
        indexes = [
            models.Index(fields=["tenant", "-created_at"], name="turn_tenant_recent"),
            models.Index(
                fields=["tenant", "continuation_hash", "id"],
                condition=~Q(continuation_hash=""),
                name="turn_continuation_id",
            ),
            models.Index(
                fields=["tenant", "continuation_hash_without_retry", "id"],
                condition=~Q(continuation_hash_without_retry=""),
                name="turn_continuation_retry_id",
            ),
            # First turns that are no regenerate: what a repeated prompt regenerates.
            models.Index(
                fields=["tenant", "prompt_hash", "id"],
                condition=~Q(prompt_hash="") & Q(parent__isnull=True, link=""),
                name="turn_prompt_first",
            ),
            # Turns whose parent was not stored yet (or not the newest candidate): found when it is.
            models.Index(
                fields=["tenant", "parent_hash", "id"],
                condition=~Q(parent_hash=""),
                name="turn_parent_hash_id",
            ),
            # Main turns still waiting for their next state, read when a session is closed or gets a turn
            # without history: in request order, so the newest before a time is one index probe.
            models.Index(
                fields=["session", "created_at"],
                name="turn_awaiting_next_at",
                condition=Q(turn_type="main", next_state__isnull=True, closed_without_next=False),
            ),
        ]

    def __str__(self) -> str:
        return f"turn {self.request_id}"

    @property
    def ready_for_judging(self) -> bool:
        return self.next_state is not None or self.closed_without_next

    @property
    def cut(self) -> bool:
        return self.ended in CUT_ENDINGS


CUT_ENDINGS = (Turn.Ended.LENGTH, Turn.Ended.CLIENT_DISCONNECT, Turn.Ended.UPSTREAM_ERROR)


class ConversationSettings(models.Model):
    """A tenant's choices about which captured turns count. Absent = the defaults."""

    tenant = models.OneToOneField(
        "tenants.Tenant", on_delete=models.CASCADE, related_name="conversation_settings"
    )
    # Judge (and so train on) replies that stopped at max_tokens. Off by default: a cut reply is graded as if
    # the model meant to stop there.
    include_length_turns = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    def __str__(self) -> str:
        return f"conversation settings of tenant {self.tenant_id}"
