"""One JSON object per log line, with the structured fields the app logs as ``extra``.

The provider-call lines (logger ``conversations.http``) carry ``turn_id``, ``attempt``,
``timeout``, ``remaining``, ``duration`` and ``outcome``; "Skipped call" lines carry
``turn_id``, ``call``, ``attempt`` and ``remaining``; ``repair_turns`` lines ``turn_id`` and
``reason``. A log shipper can then filter and graph them without parsing text. Use it from a
production settings module::

    from conversations.log import LOGGING  # noqa: F401

or name ``conversations.log.JsonFormatter`` as a formatter's ``"()"`` in a ``LOGGING`` of your own.
"""

import json
import logging

# Attributes every LogRecord has; anything else on a record came from ``extra=``.
_STANDARD = set(vars(logging.LogRecord("", 0, "", 0, "", (), None))) | {"message", "asctime", "taskName"}


class JsonFormatter(logging.Formatter):
    """Formats a record as a JSON object: time, level, logger, message, then every ``extra`` field."""

    def format(self, record):
        data = {
            "time": self.formatTime(record, "%Y-%m-%dT%H:%M:%S"),
            "level": record.levelname,
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                data[key] = value
        if record.exc_info:
            data["exc_info"] = self.formatException(record.exc_info)
        return json.dumps(data, default=str)


LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"json": {"()": JsonFormatter}},
    "handlers": {"console": {"class": "logging.StreamHandler", "formatter": "json"}},
    "root": {"handlers": ["console"], "level": "WARNING"},
    "loggers": {
        "conversations": {"handlers": ["console"], "level": "INFO", "propagate": False},
        "rq.worker": {"handlers": ["console"], "level": "INFO", "propagate": False},
    },
}
