"""Functions the group benchmark runs inside a rank (through Ray's `__ray_call__`)."""

from __future__ import annotations

import os
from pathlib import Path

COMM = ("alltoall", "all_to_all", "allgather", "all_gather", "allreduce", "all_reduce", "reduce_scatter", "wait")


def pid(worker) -> int:
    return os.getpid()


def reset_peak(worker) -> None:
    """Restart the peak-memory mark: the CUDA allocator's, or the kernel's peak RSS (clear_refs 5)."""
    import torch

    if worker.device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(worker.device)
    else:
        Path("/proc/self/clear_refs").write_text("5")


def peak(worker) -> int:
    import torch

    if worker.device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(worker.device))
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) * 1024
    return 0


def start_profile(worker) -> None:
    import torch

    worker._h3_profile = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
    worker._h3_profile.__enter__()


def stop_profile(worker) -> dict[str, float]:
    """Milliseconds in collective ops (dispatcher-level c10d and functional ops only, so nested
    backend events are not counted twice), by op."""
    prof = worker._h3_profile
    prof.__exit__(None, None, None)
    out: dict[str, float] = {}
    for e in prof.key_averages():
        name = e.key
        top = name.startswith("c10d::") or name.startswith("_c10d_functional::")
        if top and any(k in name.lower() for k in COMM):
            out[name] = out.get(name, 0.0) + e.cpu_time_total / 1000.0
    return out
