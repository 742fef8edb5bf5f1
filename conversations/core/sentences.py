"""The sentences a visitor reads when the model loop ends a turn short of a full answer."""

from django.utils.translation import gettext as _


def deadline_message():
    return _("I ran out of time before I could finish this answer. Please ask again to continue.")


def step_limit_message(steps):
    return _("I stopped after %(steps)d steps without reaching a final answer. Please ask again to continue.") % {
        "steps": steps}


def cut_short_message():
    return _("The answer was cut short: the connection to the AI service broke off. Please ask again to continue.")


def length_message():
    return _("The answer was cut short because it reached the length limit.")


def empty_reply_message():
    return _("The AI service sent an empty answer. Please try again, or ask in other words.")
