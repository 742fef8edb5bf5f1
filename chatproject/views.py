"""The demo's help articles, each at /help/<slug>/: drafts are nobody's, members-only ones need a sign-in."""

from django.http import Http404
from django.shortcuts import render

from conversations.knowledge.text import html_to_text

from .apps import members_only_rule
from .models import Article


def article(request, slug):
    visible = members_only_rule(Article.objects.filter(published=True), request.user)
    found = visible.filter(slug=slug).first()
    if found is None:
        raise Http404("No such article.")
    paragraphs = html_to_text(found.body).split("\n\n")
    return render(request, "help_article.html", {"article": found, "paragraphs": paragraphs})
