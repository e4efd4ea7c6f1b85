"""Faults injected into a rank (run there through `__ray_call__`; pickled by value)."""

from __future__ import annotations

import functools
import os
import time


def pid(worker) -> int:
    return os.getpid()


def niceness(worker) -> int:
    return os.nice(0)


def _wrap(worker, around) -> None:
    transformer = worker.generator.model.components["transformer"]
    inner = transformer.forward
    if not hasattr(worker, "unfaulted"):
        worker.unfaulted = inner  # for `clear`

    @functools.wraps(inner)
    def forward(*args, **kwargs):
        return around(inner, *args, **kwargs)

    transformer.forward = forward


def slow(worker, seconds: float) -> None:
    """Every transformer call on this rank first sleeps (its partners wait for it in a collective)."""

    def around(inner, *args, **kwargs):
        time.sleep(seconds)
        return inner(*args, **kwargs)

    _wrap(worker, around)


def oom_on_call(worker, n: int) -> None:
    """The n-th transformer call on this rank raises torch's out-of-memory error."""
    import torch

    calls = [0]

    def around(inner, *args, **kwargs):
        calls[0] += 1
        if calls[0] == n:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 20.00 GiB (injected)")
        return inner(*args, **kwargs)

    _wrap(worker, around)


def clear(worker) -> None:
    """Undo every fault injected into this rank (a group shared by several tests)."""
    if hasattr(worker, "unfaulted"):
        worker.generator.model.components["transformer"].forward = worker.unfaulted
        del worker.unfaulted


def jobs(worker) -> tuple[int, bool]:
    return worker.jobs, worker.busy
