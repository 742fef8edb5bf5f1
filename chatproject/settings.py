"""Settings of the demo site. Everything that differs between machines comes from the environment.

DATABASE_URL   default: SQLite file next to manage.py
REDIS_URL      default: redis://127.0.0.1:6379/0 (cache, sessions and the RQ queue)
SECRET_KEY     default: a development key (DEBUG is then on)
CONVERSATIONS_<KEY>  any key of the CONVERSATIONS dict, e.g. CONVERSATIONS_PROVIDER=openai
LOG_FORMAT     "json" for one JSON object per log line (conversations.log); default: plain text
"""

import os
from pathlib import Path

import dj_database_url
import django

from conversations.conf import DEFAULTS

BASE_DIR = Path(__file__).resolve().parent.parent

SECRET_KEY = os.environ.get("SECRET_KEY", "")
DEBUG = os.environ.get("DEBUG", "1" if not SECRET_KEY else "0") == "1"
if not SECRET_KEY:
    SECRET_KEY = "django-insecure-demo-key-set-SECRET_KEY-in-production"
ALLOWED_HOSTS = [h for h in os.environ.get("ALLOWED_HOSTS", "127.0.0.1,localhost,[::1]").split(",") if h]
CSRF_TRUSTED_ORIGINS = [o for o in os.environ.get("CSRF_TRUSTED_ORIGINS", "").split(",") if o]

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "rest_framework",
    "drf_spectacular",
    "django_rq",
    "conversations",
    "chatproject",
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.locale.LocaleMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
]

ROOT_URLCONF = "chatproject.urls"
WSGI_APPLICATION = "chatproject.wsgi.application"

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
            ],
        },
    },
]

DATABASES = {
    "default": dj_database_url.parse(
        os.environ.get("DATABASE_URL", f"sqlite:///{BASE_DIR / 'db.sqlite3'}"),
        conn_max_age=int(os.environ.get("CONN_MAX_AGE", "0")),
    )
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # The web server and the worker write the same file: wait for the lock instead of failing.
    DATABASES["default"].setdefault("OPTIONS", {})["timeout"] = 20
    # Take the write lock when a transaction begins: a deferred transaction that reads, then
    # writes, fails at once with "database is locked" when another writer got in between
    # (two visitors posting at the same moment), where IMMEDIATE simply waits its turn.
    DATABASES["default"]["OPTIONS"]["transaction_mode"] = "IMMEDIATE"
    # A turn commits after every round-trip. In SQLite's default rollback-journal mode each commit
    # waits for the disk twice (fsync), milliseconds each, more than the rest of the round-trip;
    # with a write-ahead log and synchronous=NORMAL a commit waits for none, and a killed worker
    # still loses nothing it committed (only a power cut may lose the last commits). Readers then
    # never block the writer either.
    DATABASES["default"]["OPTIONS"]["init_command"] = "PRAGMA journal_mode=WAL; PRAGMA synchronous=NORMAL"
    # Tests fork a real RQ work horse, which cannot see an in-memory database.
    DATABASES["default"]["TEST"] = {"NAME": os.environ.get("TEST_SQLITE_PATH", str(BASE_DIR / "test-db.sqlite3"))}

REDIS_URL = os.environ.get("REDIS_URL", "redis://127.0.0.1:6379/0")

CACHES = {
    "default": {
        "BACKEND": "conversations.cache.RedisCache",
        "LOCATION": REDIS_URL,
        "KEY_PREFIX": os.environ.get("CACHE_KEY_PREFIX", "chatproject"),
    }
}
# Sessions live in Redis, so a poll whose state is cached touches no SQL at all.
SESSION_ENGINE = "django.contrib.sessions.backends.cache"

DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
]

LANGUAGE_CODE = "en"
LANGUAGES = [("en", "English"), ("es", "Español")]
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

def _env_int(name, default):
    value = os.environ.get(name)
    return int(value) if value not in (None, "") else default


STATIC_URL = "static/"
STATICFILES_DIRS = [BASE_DIR / "static"]
STATIC_ROOT = BASE_DIR / "staticfiles"

REST_FRAMEWORK = {
    "DEFAULT_AUTHENTICATION_CLASSES": ["rest_framework.authentication.SessionAuthentication"],
    "DEFAULT_PERMISSION_CLASSES": ["rest_framework.permissions.AllowAny"],
    "DEFAULT_RENDERER_CLASSES": ["rest_framework.renderers.JSONRenderer"],
    "DEFAULT_PARSER_CLASSES": ["rest_framework.parsers.JSONParser"],
    "UNAUTHENTICATED_USER": "django.contrib.auth.models.AnonymousUser",
    "DEFAULT_SCHEMA_CLASS": "drf_spectacular.openapi.AutoSchema",
    # Behind N reverse proxies the client's address is the Nth from the right of
    # X-Forwarded-For; without it, the per-IP throttle sees every visitor as the proxy.
    "NUM_PROXIES": _env_int("NUM_PROXIES", None),
}

SPECTACULAR_SETTINGS = {
    "TITLE": "Conversations API",
    "DESCRIPTION": "The chat widget's API: start a conversation, send a message (a turn), poll it until done. "
                   "Session cookie authentication; every POST needs the csrftoken cookie and an X-CSRFToken header.",
    "VERSION": "1",
    "SERVE_INCLUDE_SCHEMA": False,
    "SCHEMA_PATH_PREFIX": "/api/",
    # The schema view itself is public (it describes public endpoints); Swagger UI only in DEBUG.
    "SERVE_PERMISSIONS": ["rest_framework.permissions.AllowAny"],
}

# The demo's mail (HANDOFF_EMAILS) is printed on the console. Django 6.1 configures mail with
# MAILERS (EMAIL_BACKEND is deprecated there); earlier versions with EMAIL_BACKEND.
if django.VERSION >= (6, 1):
    MAILERS = {"default": {"BACKEND": "django.core.mail.backends.console.EmailBackend"}}
else:
    EMAIL_BACKEND = "django.core.mail.backends.console.EmailBackend"

# Django refuses larger non-file bodies (the API's own limit, MAX_REQUEST_BYTES, is lower).
DATA_UPLOAD_MAX_MEMORY_SIZE = 256 * 1024
# Cookies only over HTTPS when not in DEBUG (set SECURE_COOKIES=0 to test a production-like
# setup over plain HTTP); SameSite=Lax keeps other sites from sending them on POSTs.
SECURE_COOKIES = os.environ.get("SECURE_COOKIES", "0" if DEBUG else "1") == "1"
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = SECURE_COOKIES
SESSION_COOKIE_SAMESITE = CSRF_COOKIE_SAMESITE = "Lax"
if os.environ.get("SECURE_PROXY_SSL_HEADER") == "1":
    # Only behind a proxy that sets X-Forwarded-Proto itself (and strips the client's).
    SECURE_PROXY_SSL_HEADER = ("HTTP_X_FORWARDED_PROTO", "https")


CONVERSATIONS = {
    "TOOLS": ["chatproject.tools.current_time", "chatproject.tools.search_faq",
              "conversations.knowledge.tool.search_site",
              # Waits for the visitor's approval before it sends anything (docs/tools.md).
              "chatproject.tools.email_answer"],
}
# CONVERSATIONS_<KEY> from the environment; conversations.conf converts each value to the
# type of its default (numbers, booleans, comma-separated lists).
CONVERSATIONS.update(
    {name[len("CONVERSATIONS_"):]: value for name, value in os.environ.items() if name.startswith("CONVERSATIONS_") and value != ""}
)

RQ_QUEUES = {
    CONVERSATIONS.get("QUEUE", DEFAULTS["QUEUE"]): {
        "URL": REDIS_URL,
        "DEFAULT_TIMEOUT": int(CONVERSATIONS.get("JOB_TIMEOUT", DEFAULTS["JOB_TIMEOUT"])),
    },
}
# Many turns per worker process, in threads; RQ_WORKER_CLASS=conversations.worker.Worker runs each turn
# in a forked work horse instead (docs/deployment.md, "Choosing the worker class"). Either one
# writes the final state of a turn whose worker died.
RQ = {"WORKER_CLASS": os.environ.get("RQ_WORKER_CLASS", "conversations.worker.ConcurrentWorker")}
# Error reports (the DEBUG page, mails to ADMINS) hide CREDENTIALS, whose keys Django's own filter
# would show (it hides settings by name), and any known key in a frame's variables.
DEFAULT_EXCEPTION_REPORTER_FILTER = "conversations.redaction.ExceptionReporterFilter"

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    # LOG_FORMAT=json: one JSON object per line, every structured field a key (docs/deployment.md).
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
        "json": {"()": "conversations.log.JsonFormatter"},
    },
    "handlers": {"console": {"class": "logging.StreamHandler",
                             "formatter": "json" if os.environ.get("LOG_FORMAT") == "json" else "plain"}},
    "loggers": {
        "conversations": {"handlers": ["console"], "level": os.environ.get("LOG_LEVEL", "INFO"), "propagate": True},
    },
}
