"""Job ids: one format for every log, file name and URL that carries one.

Minted ids are uuid4 hex; any id a log may hold (an imported one included) is letters, digits,
`_` and `-`, up to 64, starting with a letter or digit: never a path, never an option.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import StringConstraints

JOB_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_-]{0,63}$"
_JOB_ID = re.compile(JOB_ID_PATTERN)

JobId = Annotated[str, StringConstraints(pattern=JOB_ID_PATTERN)]


def is_job_id(value: str) -> bool:
    """Whether `value` is an id a job's log may hold (`JOB_ID_PATTERN`)."""
    return _JOB_ID.fullmatch(value) is not None
