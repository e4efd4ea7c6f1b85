"""Job ids: made by whoever submits (a door, to tell the job it created from one it replayed)."""

from __future__ import annotations

import uuid

__all__ = ["new_job_id"]


def new_job_id() -> str:
    """A new job id: 32 hex digits, random (a UUID4's)."""
    return uuid.uuid4().hex
