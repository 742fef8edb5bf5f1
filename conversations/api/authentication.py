from rest_framework.authentication import SessionAuthentication


class CsrfSessionAuthentication(SessionAuthentication):
    """Session authentication that checks CSRF for anonymous visitors as well.

    DRF's ``SessionAuthentication`` enforces CSRF only for logged-in users, but an
    anonymous visitor's conversation is theirs too: without the check, another site could
    post messages into it (and spend the site owner's API budget).
    """

    def authenticate(self, request):
        result = super().authenticate(request)
        if result is None:
            self.enforce_csrf(request)
        return result
