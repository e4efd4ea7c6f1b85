"""When a running attempt stores a denoising checkpoint: every `every_steps` steps and/or every
`every_s` seconds of denoising, never after the last step (a video follows it at once), and
where nothing is due, never. Pure: the executor asks `due` after each step."""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field

__all__ = ["CheckpointPolicy"]


class CheckpointPolicy(BaseModel):
    """How often an attempt checkpoints its denoising loop (0 turns a criterion off; both off: never)."""

    model_config = ConfigDict(frozen=True)

    every_steps: int = Field(default=0, ge=0)
    every_s: float = Field(default=0.0, ge=0)

    @property
    def enabled(self) -> bool:
        """Whether any criterion is on."""
        return self.every_steps > 0 or self.every_s > 0

    def due(self, step: int, total: int, last_step: int, seconds_since_last: float) -> bool:
        """Whether to checkpoint after `step` of `total`, the previous checkpoint (or the attempt's
        start) having been at `last_step`, `seconds_since_last` ago."""
        if step >= total or step <= last_step:
            return False
        by_steps = self.every_steps > 0 and step - last_step >= self.every_steps
        by_time = self.every_s > 0 and seconds_since_last >= self.every_s
        return by_steps or by_time
