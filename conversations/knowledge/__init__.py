"""The site's own knowledge: its models registered as sources (``register``), indexed into
passages as they are saved, searched by the ``search_site`` tool for what the visitor may see.
See docs/knowledge.md."""

from .registry import Source, register, sources, unregister

__all__ = ["Source", "register", "sources", "unregister"]
