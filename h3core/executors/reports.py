"""The shapes of an executor's optional reports (`Executor.health`, `head`, `attention_report`,
`device_memory`), owned by the contract: /readyz, /metrics and the console read them without
knowing the executor."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

__all__ = ["DeviceMemory", "GroupHealth", "HeadHealth", "ProbeRow", "Verdict"]


@dataclass
class GroupHealth:
    """One device group, a snapshot."""

    index: int
    size: int
    state: str = "down"  # down | starting | ready | busy | dead
    builds: int = 0
    rebuilds: int = 0  # builds after the first: each one followed a failure or a dead rank
    last_error: str | None = None
    build_seconds: float | None = None
    ranks: list[dict[str, Any]] = field(default_factory=list)  # what each rank reported at set-up


@dataclass
class HeadHealth:
    """The cluster head the groups run on, a snapshot."""

    state: str = "down"  # down | connecting | up | lost | reconnecting
    address: str | None = None  # the GCS
    losses: int = 0
    reconnects: int = 0
    last_error: str | None = None


Verdict = Literal["chosen", "accepted", "rejected", "failed", "unsupported", "not needed"]


@dataclass(frozen=True)
class ProbeRow:
    """One kernel as the start-up probe found it (kernel_probe.decide)."""

    kernel: str
    verdict: Verdict
    ms: float | None = None  # median of one attention call at `tokens`
    tokens: int | None = None  # the sequence length `ms` and `peak_bytes` were measured at
    peak_bytes: int | None = None  # the allocator's peak during the call above its inputs (CUDA only)
    error: float | None = None  # worst relative L1 error against the float32 reference, over the probe's lengths
    note: str = ""  # what is missing, what it raised, or where its error exceeded the tolerance


@dataclass(frozen=True)
class DeviceMemory:
    """One device's memory as its executor reads it now: `total_bytes` and `free_bytes` as the
    driver counts them (every process on the device), and `held_bytes`, what the executor's own
    allocator holds of it (None where it cannot tell)."""

    name: str
    total_bytes: int
    free_bytes: int
    held_bytes: int | None = None
