"""Every sentence a visitor reads when a turn ends short of a full answer: in the model loop
(the runner), in the job, and outside it (a turn never picked up, a work horse that died, a
queue that could not be reached). One function per sentence, so each is written once."""

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


def crashed_message():
    return _("The assistant stopped unexpectedly before finishing. Please try again.")


def unavailable_message():
    return _("The assistant is unavailable right now. Please try again in a minute.")


def not_picked_up_message():
    return _("The assistant is not available right now. Please try again later.")


def timeout_message():
    return _("The assistant ran out of time on this answer. Please try again.")
