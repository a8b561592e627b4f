"""Process logging for `radixgen serve`: human-readable text, or one JSON object per line.

`configure_logging(level, "json")` makes every record one line such as

    {"time": "2025-01-01T12:00:00.123+00:00", "level": "INFO", "logger": "radixgen.requests",
     "message": "Finish: rid=...", "request": {"rid": "...", "prompt_tokens": 25, ...}}

The structured fields that the request log and the batch-stats log attach (`record.request`,
`record.stats`) become nested objects, so log pipelines need no parsing of the message; a record that
carries a short `summary` (the request line without its bodies) has that as its message.
"""

from __future__ import annotations

import json
import logging
import sys
from datetime import datetime, timezone
from typing import Literal

LogFormat = Literal["text", "json"]
TEXT_FORMAT = "%(asctime)s %(name)s %(levelname)s %(message)s"
STRUCTURED = ("request", "stats")  # record attributes carried as JSON objects


class JsonFormatter(logging.Formatter):
    """One JSON object per record: time, level, logger, message, structured fields, exception."""

    def format(self, record: logging.LogRecord) -> str:
        out = {
            "time": datetime.fromtimestamp(record.created, timezone.utc).isoformat(timespec="milliseconds"),
            "level": record.levelname,
            "logger": record.name,
            "message": getattr(record, "summary", None) or record.getMessage(),
        }
        for key in STRUCTURED:
            if hasattr(record, key):
                out[key] = getattr(record, key)
        if record.exc_info:
            out["exception"] = self.formatException(record.exc_info)
        return json.dumps(out, ensure_ascii=False, default=str)


def configure_logging(level: str, fmt: LogFormat = "text") -> None:
    """Send the root logger's records to stderr at `level` ("debug", "info", ...) in `fmt`."""
    if fmt not in ("text", "json"):
        raise ValueError(f"log format {fmt!r} is invalid: must be text or json")
    handler = logging.StreamHandler(sys.stderr)
    handler.setFormatter(JsonFormatter() if fmt == "json" else logging.Formatter(TEXT_FORMAT))
    logging.basicConfig(level=level.upper(), handlers=[handler], force=True)
