"""HTTP byte ranges (RFC 9110 §14): which part of a file a request asks for."""

from __future__ import annotations

import re

_RANGE = re.compile(r"^\s*bytes\s*=\s*(\d*)\s*-\s*(\d*)\s*$")


class Unsatisfiable(ValueError):
    """A range that lies outside the file: answer 416."""


def parse_range(header: str | None, size: int) -> tuple[int, int] | None:
    """(first, last) byte, inclusive, or None to send the whole file.

    A header we do not understand, or one with several ranges, is ignored (the whole file is a
    valid answer to any Range request); a range past the end is `Unsatisfiable`.
    """
    if not header:
        return None
    m = _RANGE.match(header)
    if m is None:
        return None
    first, last = m.group(1), m.group(2)
    if first == "" and last == "":
        return None
    if first == "":  # the last N bytes
        n = int(last)
        if n == 0:
            raise Unsatisfiable(header)
        return max(size - n, 0), size - 1
    start = int(first)
    end = size - 1 if last == "" else min(int(last), size - 1)
    if start >= size or (last != "" and int(last) < start):
        raise Unsatisfiable(header)
    return start, end
