"""django-rq's dashboard, for superusers only: ``path("django-rq/", include("conversations.rq_urls"))``
in place of ``include("django_rq.urls")``.

django-rq lets any staff user empty a queue, delete or requeue jobs and stop them; emptying the
turns' queue leaves visitors' turns queued with no job, while this app's own stop and re-run
actions in the admin need the ``change_turn`` permission. Here every dashboard page needs a
superuser: other staff get 403, anonymous visitors the admin's login page. The token-protected
JSON stats and metrics views are django-rq's as they are.
"""

from functools import wraps

from django.contrib.auth.views import redirect_to_login
from django.core.exceptions import PermissionDenied
from django.urls import reverse
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


urlpatterns = get_api_urlpatterns() + get_admin_urlpatterns(view_wrapper=superuser_required)
