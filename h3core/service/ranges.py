"""HTTP byte ranges (RFC 9110 §14): which part of a file a request asks for."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")
# Longer positions than any file can have are read as "past the end" without parsing them:
# int() refuses more than 4,300 digits, and nothing here needs the exact value.
_DIGITS = 18


class Unsatisfiable(ValueError):
    """A range that lies outside the file: answer 416."""


def _position(digits: str) -> int:
    return int(digits) if len(digits) <= _DIGITS else 10**_DIGITS


def parse_range(header: str | None, size: int, *, if_range: str | None = None, etag: str | None = None) -> tuple[int, int] | None:
    """(first, last) byte, inclusive, or None to send the whole file.

    Ignored, as RFC 9110 says (the whole file is a valid answer to any Range request): a header
    we do not understand, several ranges, an invalid one (`bytes=5-3`), and any Range whose
    `If-Range` is not the file's current (strong) ETag. A range past the end is `Unsatisfiable`.
    """
    if not header:
        return None
    if if_range is not None and (etag is None or if_range.strip() != etag):
        return None  # the client's copy is not this file (or If-Range is a date we cannot match)
    m = _RANGE.match(header)
    if m is None:
        return None
    first, last = m.group(1), m.group(2)
    if first == "" and last == "":
        return None
    if first == "":  # the last N bytes
        n = _position(last)
        if n == 0 or size == 0:  # no byte to send: an empty file satisfies no range
            raise Unsatisfiable(header)
        return max(size - n, 0), size - 1
    start = _position(first)
    if last != "" and _position(last) < start:
        return None  # invalid: ignored, not refused (RFC 9110 §14.1.1)
    if start >= size:
        raise Unsatisfiable(header)
    end = size - 1 if last == "" else min(_position(last), size - 1)
    return start, end
