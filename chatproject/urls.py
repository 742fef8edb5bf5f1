from django.conf import settings
from django.contrib import admin
from django.http import Http404
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

from chatproject.views import article

_swagger_ui = SpectacularSwaggerView.as_view(url_name="api-schema")


def api_docs(request):
    """Swagger UI for the API schema, only while DEBUG is on (it loads its scripts from a CDN)."""
    if not settings.DEBUG:
        raise Http404
    return _swagger_ui(request)


urlpatterns = [
    # First: Django tries the patterns in order, and every widget polls the API's first pattern
    # while a turn runs (each pattern tried before it cost the poll a few microseconds).
    path("api/", include("conversations.api.urls", namespace="conversations")),
    path("", TemplateView.as_view(template_name="index.html"), name="home"),
    path("admin/", admin.site.urls),
    path("help/<slug:slug>/", article, name="help-article"),
    # django-rq's dashboard, for superusers only (see conversations/rq_urls.py).
    path("django-rq/", include("conversations.rq_urls")),
    # The OpenAPI schema of the API (YAML; ?format=json for JSON).
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
    path("api/schema/ui/", api_docs, name="api-docs"),
]
