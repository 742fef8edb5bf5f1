from django.conf import settings
from django.contrib import admin
from django.urls import include, path
from django.views.generic import TemplateView
from drf_spectacular.views import SpectacularAPIView, SpectacularSwaggerView

urlpatterns = [
    path("", TemplateView.as_view(template_name="index.html"), name="home"),
    path("admin/", admin.site.urls),
    path("django-rq/", include("django_rq.urls")),
    path("api/", include("conversations.api.urls", namespace="conversations")),
    # The OpenAPI schema of the API (YAML; ?format=json for JSON). Swagger UI only while developing.
    path("api/schema/", SpectacularAPIView.as_view(), name="api-schema"),
]

if settings.DEBUG:
    urlpatterns.append(path("api/schema/ui/", SpectacularSwaggerView.as_view(url_name="api-schema"), name="api-docs"))
