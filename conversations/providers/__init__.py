"""Model providers. ``get_provider_class()`` resolves the ``PROVIDER`` setting."""

from django.utils.module_loading import import_string

from ..endpoints import BUILTIN_PROVIDERS
from .base import BaseProvider, ProviderError, call_complete, redact

BUILTIN = BUILTIN_PROVIDERS


def get_provider_class(name):
    """Return the provider class for a short name (``demo``, ``openai``, ``anthropic``) or a dotted path."""
    path = BUILTIN.get(name, name)
    cls = import_string(path)
    if not (isinstance(cls, type) and issubclass(cls, BaseProvider)):
        raise TypeError(f"{path} is not a BaseProvider subclass")
    return cls


__all__ = ["BaseProvider", "ProviderError", "call_complete", "get_provider_class", "redact"]
