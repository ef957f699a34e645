"""``--log-format json``: one JSON object per log record, one record per line; the text
format, one line per record too.

Every object has ``time`` (ISO 8601, UTC, milliseconds), ``level``, ``logger`` and
``message`` (the formatted text, as the text format shows it); the fields a log call
passes in ``extra=`` (e.g. ``epoch``, ``updates_sent``) follow under their own names, and a
record with an exception carries its traceback as one string in ``exception``. Values
JSON cannot hold are written as their text.
"""

from __future__ import annotations

import json
import logging
from datetime import UTC, datetime
from typing import Any

from snet.protocol.worker_name import printable

# The attributes every LogRecord has: anything else on a record came from ``extra=``.
_STANDARD = frozenset(vars(logging.LogRecord("", 0, "", 0, "", None, None))) | {
    "message",
    "asctime",
    "taskName",
}


class TextFormatter(logging.Formatter):
    """Time, level, source and message, the message's control characters as escapes: words
    a peer sent (a goodbye's reason, an error's text) can neither forge a line nor drive the
    terminal (protocol/worker_name.py). A traceback keeps its lines."""

    def __init__(self) -> None:
        super().__init__("%(asctime)s %(levelname)-7s %(name)s: %(message)s")

    def formatMessage(self, record: logging.LogRecord) -> str:
        record.message = printable(record.message)
        return super().formatMessage(record)


class JsonFormatter(logging.Formatter):
    """A log record as one line of JSON."""

    def format(self, record: logging.LogRecord) -> str:
        stamp = datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds")
        document: dict[str, Any] = {
            "time": stamp.replace("+00:00", "Z"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in vars(record).items():
            if key not in _STANDARD and not key.startswith("_"):
                document[key] = value
        if record.exc_info:
            document["exception"] = self.formatException(record.exc_info)
        elif record.exc_text:
            document["exception"] = record.exc_text
        return json.dumps(document, default=str, ensure_ascii=False)
