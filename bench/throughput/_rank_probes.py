"""Functions the group benchmark runs inside a rank (through Ray's `__ray_call__`)."""

from __future__ import annotations

import os
from pathlib import Path


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


def _comm_sites():
    """Every place a rank waits on its partners: FSDP2's all-gathers, Ulysses' all-to-alls and size
    exchanges, the padded gather, the stop flag's all-reduce."""
    import torch.distributed as dist
    import torch.distributed._functional_collectives as funcol
    from diffusers.models import _modeling_parallel, attention_dispatch
    from torch.distributed.fsdp._fully_shard._fsdp_param_group import FSDPParamGroup

    return [
        ("fsdp all-gather", FSDPParamGroup, "unshard"),
        ("fsdp all-gather", FSDPParamGroup, "wait_for_unshard"),
        ("ulysses all-to-all", funcol, "all_to_all_single"),
        ("ulysses all-to-all", attention_dispatch, "_wait_tensor"),
        ("size exchange", attention_dispatch, "gather_size_by_comm"),
        ("size exchange", _modeling_parallel, "gather_size_by_comm"),
        ("sequence gather", dist, "all_gather"),
        ("stop flag", dist, "all_reduce"),
    ]


def start_comm_timer(worker) -> None:
    """Wrap every collective site with a timer (milliseconds summed per kind of the outermost site)."""
    import functools
    import threading
    import time

    totals: dict[str, float] = {}
    lock = threading.Lock()
    depth = threading.local()  # only the outermost site is timed: the padded gather exchanges sizes inside
    saved = []
    for kind, owner, name in _comm_sites():
        inner = getattr(owner, name)

        def timed(*args, _inner=inner, _kind=kind, **kwargs):
            if getattr(depth, "n", 0):
                return _inner(*args, **kwargs)
            depth.n = 1
            t0 = time.perf_counter()
            try:
                return _inner(*args, **kwargs)
            finally:
                depth.n = 0
                with lock:
                    totals[_kind] = totals.get(_kind, 0.0) + (time.perf_counter() - t0) * 1000

        setattr(owner, name, functools.wraps(inner)(timed))
        saved.append((owner, name, inner))
    worker._h3_comm = (totals, saved)


def stop_comm_timer(worker) -> dict[str, float]:
    totals, saved = worker._h3_comm
    for owner, name, inner in reversed(saved):
        setattr(owner, name, inner)
    return dict(totals)
