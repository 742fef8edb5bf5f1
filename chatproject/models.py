"""The demo site's help centre: articles the assistant searches (``apps.HelpConfig.ready``)."""

from django.db import models


class Article(models.Model):
    """A help article: a draft until ``published``; ``members_only`` ones are for signed-in users."""

    slug = models.SlugField(unique=True)
    title = models.CharField(max_length=200)
    body = models.TextField(help_text="HTML.")
    published = models.BooleanField(default=True)
    members_only = models.BooleanField(default=False)
    updated_at = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["title"]

    def __str__(self):
        return self.title

    def get_absolute_url(self):
        return f"/help/{self.slug}/"
