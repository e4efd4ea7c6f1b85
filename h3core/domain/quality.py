"""Quality levels: how much denoising work a job may skip for speed.

`exact` computes every transformer step (the video h3core always made). The faster levels let the
executor serve some steps from a cache of the previous step's transformer output where two
steps are alike (the mapping to a cache and its thresholds is the executor's; for the pipeline,
`h3core.executors.pipeline.caching`, justified in docs/operations.md, "Quality levels"). A job's
`done` event says how many steps were computed and how many were served from the cache.
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["QUALITIES", "Quality", "StepCounts"]

Quality = Literal["exact", "balanced", "fast"]
QUALITIES: tuple[Quality, ...] = ("exact", "balanced", "fast")


class StepCounts(BaseModel):
    """The transformer steps of a finished job at its quality level: `computed` ran the whole
    transformer, `cached` were served from the cache (only the first block ran). Part of `done`."""

    model_config = ConfigDict(frozen=True, strict=True, extra="forbid")

    quality: Quality
    computed: int = Field(ge=0)
    cached: int = Field(ge=0)
