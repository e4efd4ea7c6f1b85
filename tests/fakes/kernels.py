"""Attention kernels that break the process measuring them, for the start-up probe's child
(`kernel_probe.STAND_INS_ENV=tests.fakes.kernels:faulting`): on a CPU, the three sage kernels stand
in for community builds that fault. Each call does what a faulting build does to its process."""

from __future__ import annotations

import os
import signal

from h3core.executors.pipeline.attention import ANY_FLOAT, KERNELS, Kernel, Rule

SPEC = "tests.fakes.kernels:faulting"
CPU_ANY = (Rule("cpu", ANY_FLOAT),)


def segfault(q, k, v):
    os.kill(os.getpid(), signal.SIGSEGV)  # a bad memory access in a CUDA extension


def cuda_error(q, k, v):
    raise RuntimeError("CUDA error: an illegal memory access was encountered")


def exits(q, k, v):
    os._exit(70)  # a library that aborts the interpreter


def faulting():
    """(kernels, calls) for `kernel_probe.decide`: the real kernels, the sage ones runnable here and faulting."""
    calls = {"sage-fp16": segfault, "sage-fp8": cuda_error, "sage-triton": exits}
    kernels = {**KERNELS, **{name: Kernel(name, CPU_ANY, backend="stand-in") for name in calls}}
    return kernels, calls
