"""The turn list's own filters: turns that ended near their deadline, turns no worker started, and the
visitor's rating."""

from django.contrib import admin
from django.db.models import F
from django.utils.translation import gettext_lazy

from ..models import Turn


class NearDeadlineFilter(admin.SimpleListFilter):
    """Turns whose final write came close to, or after, the job's own deadline.

    ``margin_left`` is the time left before RQ's job timeout at the final write, and the own
    deadline sits ``deadline_margin`` before that timeout. "Near" means the final write came
    later than ``NEAR_SECONDS`` before the own deadline; "overran" that it came after it, in
    the margin kept for the final write. Turns that never reached a final write are in neither.
    """

    title = gettext_lazy("ended near the deadline")
    parameter_name = "deadline"
    NEAR_SECONDS = 5.0

    def lookups(self, request, model_admin):
        return [
            ("near", gettext_lazy("within %(s)d s of its deadline or later") % {"s": self.NEAR_SECONDS}),
            ("overran", gettext_lazy("after its deadline")),
        ]

    def queryset(self, request, queryset):
        if self.value() == "near":
            return queryset.filter(margin_left__lt=F("deadline_margin") + self.NEAR_SECONDS)
        if self.value() == "overran":
            return queryset.filter(margin_left__lt=F("deadline_margin"))
        return queryset


class QueueFilter(admin.SimpleListFilter):
    """Turns that no worker ever started: still waiting in the queue, or ended there (no worker
    picked them up within ``QUEUE_WAIT``, the queue was unreachable, or the visitor stopped them)."""

    title = gettext_lazy("picked up by a worker")
    parameter_name = "worker"

    def lookups(self, request, model_admin):
        return [
            ("waiting", gettext_lazy("not yet: waiting in the queue")),
            ("never", gettext_lazy("never: ended in the queue")),
        ]

    def queryset(self, request, queryset):
        if self.value() == "waiting":
            return queryset.filter(status=Turn.Status.QUEUED)
        if self.value() == "never":
            return queryset.filter(status__in=Turn.DONE_STATUSES, started_at__isnull=True)
        return queryset


class RatingFilter(admin.SimpleListFilter):
    """Turns by the visitor's rating: thumbs up, thumbs down, any, with a comment, or none."""

    title = gettext_lazy("visitor's rating")
    parameter_name = "rating"

    def lookups(self, request, model_admin):
        return [("up", gettext_lazy("thumbs up")), ("down", gettext_lazy("thumbs down")),
                ("rated", gettext_lazy("rated")), ("commented", gettext_lazy("rated, with a comment")),
                ("none", gettext_lazy("not rated"))]

    def queryset(self, request, queryset):
        value = self.value()
        if value in ("up", "down"):
            return queryset.filter(rating=value)
        if value == "rated":
            return queryset.exclude(rating="")
        if value == "commented":
            return queryset.exclude(rating="").exclude(rating_comment="")
        if value == "none":
            return queryset.filter(rating="")
        return queryset
