"""The visitor's session when Redis is down: an error the API view can answer, not a wrong answer.

Sessions kept in the cache (``SESSION_ENGINE = "django.contrib.sessions.backends.cache"``, as
the README recommends) fail in two quiet ways when the cache cannot be reached:

- Django reads them as empty (the store's ``load()`` swallows every error), so the visitor
  would look like a stranger (404) or logged out (403 on a site with ``LOGIN_REQUIRED``);
- ``SessionMiddleware`` saves a changed session after the view has answered, where a failure
  can only become Django's HTML 500.

``check_session_store`` and ``save_session`` move both into the view, where the API answers an
unreachable Redis with its JSON 503.
"""

from django.conf import settings
from django.contrib.sessions.backends.base import UpdateError
from django.contrib.sessions.backends.cache import SessionStore as CacheSessionStore
from redis.exceptions import RedisError

try:  # django-redis, a common cache backend, raises its own error unless told to ignore them
    from django_redis.exceptions import ConnectionInterrupted
except ImportError:  # pragma: no cover - not installed here
    ConnectionInterrupted = RedisError

# What a Redis that cannot be reached raises through the cache backends a site may use (Django's
# own RedisCache and this app's raise redis-py's errors) and through RQ.
UNAVAILABLE_ERRORS = (RedisError, ConnectionInterrupted)


def check_session_store(request):
    """Raise one of ``UNAVAILABLE_ERRORS`` when the request carries a session cookie and its
    session lives in a cache that cannot be reached; else return None.

    Uses the cookie, not ``request.session.session_key``: a load that already failed has
    forgotten the key. For a cache-backed session not loaded yet this is its load, one Redis
    ``GET`` whose error is not swallowed: the session found is handed to the request's store,
    so the view reads it without asking Redis again (an ``EXISTS`` then the ``GET`` before). A
    key the cache does not hold is left to Django's own load, which drops it."""
    key = request.COOKIES.get(settings.SESSION_COOKIE_NAME)
    store = getattr(request, "session", None)
    if not key or not isinstance(store, CacheSessionStore):
        return
    if store.accessed or store.session_key != key or type(store).load is not CacheSessionStore.load:
        store.exists(key)  # loaded already, a malformed cookie, or a store that loads its own way
        return
    data = store._cache.get(store.cache_key)
    if data is not None:
        store._session_cache = data


def save_session(request):
    """Save the request's session now, inside the view, when ``SessionMiddleware`` would save it
    after the view (changed, or ``SESSION_SAVE_EVERY_REQUEST``, and not empty); returns None.

    A store that cannot be reached raises here, where the view answers 503. The middleware still
    saves again and sets the cookie as usual (one more write of the same data). A session
    deleted meanwhile (``UpdateError``) is left to the middleware, which reports it its own way.
    """
    session = getattr(request, "session", None)
    if session is None or not (session.modified or settings.SESSION_SAVE_EVERY_REQUEST) or session.is_empty():
        return
    try:
        session.save()
    except UpdateError:
        pass
