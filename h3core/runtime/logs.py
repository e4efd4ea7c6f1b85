"""Logging for a process that runs h3core (`h3core serve`, `h3core worker`).

h3core logs through the standard library under `h3core.<module>` and configures nothing on
import (the package adds a NullHandler, as the logging HOWTO asks of libraries). A record's
structured fields (`job_id`, `attempt`, `executor`, `kind`, ...) travel in `extra`; `configure`
prints them after the message as `key=value` (text) or as keys of one JSON object per line.
"""

from __future__ import annotations

import json
import logging
import math
import sys
from datetime import UTC, datetime
from typing import Literal, TextIO

LogFormat = Literal["text", "json"]
LogLevel = Literal["debug", "info", "warning", "error"]
FORMATS: tuple[LogFormat, ...] = ("text", "json")
LEVELS: tuple[LogLevel, ...] = ("debug", "info", "warning", "error")

# Attributes every LogRecord has: whatever else a record carries came in `extra`.
# uvicorn's `color_message` is its message again, with terminal colours.
_STANDARD = frozenset(vars(logging.makeLogRecord({}))) | {"message", "asctime", "taskName", "color_message"}

# Libraries that log every request at INFO (httpx: one line per call to ComfyUI, most of a log):
# their warnings and errors are kept, their chatter is not.
QUIET = ("httpx", "httpcore")


def fields(record: logging.LogRecord) -> dict[str, object]:
    """The structured fields a record was given in `extra`."""
    attrs = vars(record)
    if attrs.keys() <= _STANDARD:  # most records (a library's): no field at all, found by one set operation
        return {}
    return {k: v for k, v in attrs.items() if k not in _STANDARD and not k.startswith("_")}


# The last second a record was stamped in, and its text: records come many to a second, and
# building a datetime for each was most of a stamp's cost.
_second: tuple[int, str] = (-1, "")


def _ts(record: logging.LogRecord) -> str:
    """`2026-12-02T06:21:13.123Z`: what `datetime.fromtimestamp(created, UTC).isoformat(timespec="milliseconds")`
    gives (microseconds rounded half to even, then milliseconds truncated), with the seconds' text reused."""
    global _second
    t = record.created
    sec = math.floor(t)
    us = round((t - sec) * 1e6)
    if us >= 1_000_000:
        sec, us = sec + 1, us - 1_000_000
    cached = _second
    if cached[0] != sec:
        cached = _second = (sec, datetime.fromtimestamp(sec, UTC).strftime("%Y-%m-%dT%H:%M:%S"))
    return f"{cached[1]}.{us // 1000:03d}Z"


class JsonLines(logging.Formatter):
    """One JSON object per record: ts, level, logger, message, the extra fields, and `exc` (a
    traceback) where the record has one."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of JSON."""
        line: dict[str, object] = {
            "ts": _ts(record),
            "level": record.levelname.lower(),
            "logger": record.name,
            "message": record.getMessage(),
        }
        for key, value in fields(record).items():
            line.setdefault(key, value)  # an extra field never hides one of the four above
        if record.exc_info:
            line["exc"] = self.formatException(record.exc_info)
        return json.dumps(line, default=str, ensure_ascii=False)


class Text(logging.Formatter):
    """`ts LEVEL logger: message key=value ...`, a traceback on the lines after."""

    def format(self, record: logging.LogRecord) -> str:
        """The record as one line of text (and its traceback, if any, after it)."""
        extra = " ".join(f"{k}={v}" for k, v in fields(record).items())
        line = f"{_ts(record)} {record.levelname} {record.name}: {record.getMessage()}" + (f" {extra}" if extra else "")
        if record.exc_info:
            line += "\n" + self.formatException(record.exc_info)
        return line


class _Handler(logging.StreamHandler):
    """Ours: a second `configure` replaces it rather than adding another."""


class _Stderr(_Handler):
    """Ours, on whatever `sys.stderr` is when a record is written: a stream replaced since (a
    test's capture, closed at the test's end; a redirect) is never written to afterwards."""

    @property
    def stream(self) -> TextIO:
        return sys.stderr

    @stream.setter
    def stream(self, _: TextIO) -> None:
        pass


def configure(format: LogFormat = "text", level: LogLevel = "info", stream: TextIO | None = None) -> None:
    """Send every log record at `level` or above to `stream` (stderr) in `format`; the `QUIET`
    libraries' only from WARNING."""
    if format not in FORMATS:
        raise ValueError(f"log format {format!r}: use one of {', '.join(FORMATS)}")
    if level not in LEVELS:
        raise ValueError(f"log level {level!r}: use one of {', '.join(LEVELS)}")
    root = logging.getLogger()
    for old in [h for h in root.handlers if isinstance(h, _Handler)]:
        root.removeHandler(old)
    handler = _Handler(stream) if stream is not None else _Stderr()
    handler.setFormatter(JsonLines() if format == "json" else Text())
    root.addHandler(handler)
    root.setLevel(level.upper())
    # Neither format shows where a record was made (file, line, function) nor its thread or
    # process, so a record does not look them up (the logging HOWTO's "Optimization"): a third
    # of what each record cost; the runner writes three per job at INFO.
    logging._srcfile = None
    logging.logThreads = logging.logProcesses = logging.logMultiprocessing = False
    for name in QUIET:
        logging.getLogger(name).setLevel(logging.WARNING)
