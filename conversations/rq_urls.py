"""django-rq's dashboard, for superusers only: ``path("django-rq/", include("conversations.rq_urls"))``
in place of ``include("django_rq.urls")``.

django-rq lets any staff user empty a queue, delete or requeue jobs and stop them; emptying the
turns' queue leaves visitors' turns queued with no job, while this app's own stop and re-run
actions in the admin need the ``change_turn`` permission. Here every dashboard page needs a
superuser: other staff get 403, anonymous visitors the admin's login page. The JSON stats and
metrics views answer a superuser's session or django-rq's API token (``RQ_API_TOKEN``); django-rq
itself lets any staff session read them (Redis host, port and database), so here another
user's session counts for nothing there.
"""

from functools import wraps

from django.contrib.auth.models import AnonymousUser
from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.urls import URLPattern, reverse
from django_rq.urls import get_admin_urlpatterns, get_api_urlpatterns

app_name = "django_rq"


def superuser_required(view):
    """Wrap a dashboard view: a superuser passes; other staff get 403; anyone else is sent to log in."""

    @wraps(view)
    def guarded(request, *args, **kwargs):
        user = request.user
        if not (user.is_active and user.is_staff):
            return redirect_to_login(request.get_full_path(), reverse("admin:login"))
        if not user.is_superuser:
            raise PermissionDenied("The queue dashboard is for superusers.")
        return view(request, *args, **kwargs)

    return guarded


def token_or_superuser(view):
    """Wrap an API view (stats, metrics): a superuser's session passes; any other request is
    answered by django-rq as an anonymous one, so only its token lets it in (401 otherwise)."""

    @wraps(view)
    def guarded(request, *args, **kwargs):
        if not (request.user.is_active and request.user.is_superuser):
            request.user = AnonymousUser()
        return view(request, *args, **kwargs)

    return guarded


urlpatterns = [URLPattern(p.pattern, token_or_superuser(p.callback), p.default_args, p.name)
               for p in get_api_urlpatterns()] + get_admin_urlpatterns(view_wrapper=superuser_required)
