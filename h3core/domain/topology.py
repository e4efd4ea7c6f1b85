"""How a machine's devices become executor slots, and which slot a job goes to (pure).

N devices are split into groups (4 GPUs as 1x4, 2x2, 4x1, or mixed as 2+1+1). Each group is one
slot: one job at a time, its transformer spread over the group's ranks. A job may go to any idle
group whose token budget fits it; the smallest such group is chosen, so large groups stay free
for the jobs only they can hold.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Parallelism = Literal["fsdp+ulysses", "fsdp", "ulysses"]


class GroupPlan(BaseModel):
    """One device group: its index among the groups, and the devices its ranks run on."""

    model_config = ConfigDict(frozen=True)

    index: int
    devices: tuple[int, ...]  # device ordinals on the node (for CPU groups: rank numbers)

    @property
    def size(self) -> int:
        """How many ranks (devices) the group has."""
        return len(self.devices)


class Topology(BaseModel):
    """`devices` split into groups of the given sizes, in order."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    devices: int = Field(ge=1, le=1024)
    group_sizes: tuple[int, ...]
    parallel: Parallelism = "fsdp+ulysses"

    @classmethod
    def uniform(cls, devices: int, group_size: int, parallel: Parallelism = "fsdp+ulysses") -> Topology:
        """`devices` split into groups of `group_size` each; ValueError unless it divides them."""
        if group_size < 1 or devices % group_size:
            raise ValueError(f"group_size: {group_size} does not divide devices ({devices}) into whole groups")
        return cls(devices=devices, group_sizes=(group_size,) * (devices // group_size), parallel=parallel)

    @classmethod
    def parse(cls, devices: int, group_size: str | int, parallel: Parallelism = "fsdp+ulysses") -> Topology:
        """`group_size` is one size ("2": every group) or the sizes in order ("2,1,1")."""
        text = str(group_size).strip()
        try:
            sizes = tuple(int(part) for part in text.split(","))
        except ValueError:
            raise ValueError(f"group_size: {text!r} is not a size or a comma-separated list of sizes") from None
        if len(sizes) == 1:
            return cls.uniform(devices, sizes[0], parallel)
        return cls(devices=devices, group_sizes=sizes, parallel=parallel)

    @model_validator(mode="after")
    def _whole(self) -> Topology:
        if not self.group_sizes or any(s < 1 for s in self.group_sizes):
            raise ValueError(f"group_size: every group needs at least one device, got {list(self.group_sizes)}")
        if sum(self.group_sizes) != self.devices:
            raise ValueError(
                f"group_size: groups of {list(self.group_sizes)} use {sum(self.group_sizes)} devices, "
                f"but devices is {self.devices}"
            )
        return self

    def groups(self) -> tuple[GroupPlan, ...]:
        """The groups in order, each on the devices that follow the previous group's."""
        out, first = [], 0
        for index, size in enumerate(self.group_sizes):
            out.append(GroupPlan(index=index, devices=tuple(range(first, first + size))))
            first += size
        return tuple(out)


def fits(tokens: int | None, size: int, budgets: Mapping[int, int]) -> bool:
    """Whether a job of `tokens` fits a group of `size` (no budget for that size: it fits)."""
    budget = budgets.get(size)
    return tokens is None or budget is None or tokens <= budget


def place(tokens: int | None, idle: Sequence[GroupPlan], budgets: Mapping[int, int]) -> GroupPlan | None:
    """The smallest idle group the job fits (lowest index among equals), or None to wait."""
    fitting = [g for g in idle if fits(tokens, g.size, budgets)]
    return min(fitting, key=lambda g: (g.size, g.index), default=None)


def can_ever_fit(tokens: int | None, groups: Sequence[GroupPlan], budgets: Mapping[int, int]) -> bool:
    """Whether any of `groups`, busy or idle, fits a job of `tokens`."""
    return any(fits(tokens, g.size, budgets) for g in groups)


def rank_device_problem(device: str, placement: Mapping[str, str]) -> str | None:
    """Why a group's ranks cannot run on `device` with parts placed at `placement`, or None: each
    rank runs on the CPU or on its own GPU ("cuda"), never on a GPU named by ordinal."""
    for name, where in {"device": device, **{f"{part}_device": d for part, d in placement.items()}}.items():
        if where not in ("cpu", "cuda"):
            return f"{name}: a group's ranks run on 'cpu' or 'cuda' (each rank's own GPU), not {where!r}"
    return None
