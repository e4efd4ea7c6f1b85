"""Step 1: what this machine is: versions and where each package is imported from, the GPU, what
Triton needs to launch a kernel (a C compiler and Python.h), whether sageattention imports, and
whether the project's modules do.

Exits 1, with one line saying why (no traceback), where torch does not import or (outside a dry
run) sees no CUDA device: gpu_check.sh then runs no later step, each of which would fail the same way."""

from __future__ import annotations

import importlib
import os
import platform
import shutil
import sys
import sysconfig
from importlib import metadata
from pathlib import Path

from bench.gpu.common import DEVICE, DRY, md, one_line

print(f"## Environment ({'dry run: CPU, toy sizes' if DRY else DEVICE})\n")
print(
    f"python {sys.version.split()[0]} at {sys.executable} ({platform.machine()}); PYTHONPATH={os.environ.get('PYTHONPATH', '')}\n"
)
rows = []
for mod, dist in [
    ("torch", "torch"),
    ("triton", "triton"),
    ("diffusers", "diffusers"),
    ("transformers", "transformers"),
    ("tokenizers", "tokenizers"),
    ("huggingface_hub", "huggingface-hub"),
    ("sageattention", "sageattention"),
    ("pydantic", "pydantic"),
    ("pydantic_core", "pydantic-core"),
    ("accelerate", "accelerate"),
    ("av", "av"),
    ("sqlite_utils", "sqlite-utils"),
    ("numpy", "numpy"),
    ("PIL", "pillow"),
    ("anyio", "anyio"),
    ("rich", "rich"),
    ("safetensors", "safetensors"),
]:
    try:
        version = metadata.version(dist)
    except metadata.PackageNotFoundError:
        version = "-"
    try:
        m = importlib.import_module(mod)
        origin = str(Path(m.__file__).parent) if getattr(m, "__file__", None) else "?"
    except Exception as exc:  # noqa: BLE001 - report it and go on
        origin = f"IMPORT FAILS: {one_line(exc, 160)}"
    rows.append([dist, version, origin])
print(md(["package", "version", "imported from"], rows) + "\n")

try:
    import torch
except Exception as exc:  # noqa: BLE001 - the one line that says why nothing else can run
    print(f"STOP: torch does not import with {sys.executable}: {one_line(exc, 200)}; no later step can run")
    sys.exit(1)

print(
    f"torch {torch.__version__}; CUDA build {torch.version.cuda}; cuDNN {torch.backends.cudnn.version()}; "
    f"CUDA available {torch.cuda.is_available()}; {torch.cuda.device_count()} GPU(s)"
)
for i in range(torch.cuda.device_count()):
    p = torch.cuda.get_device_properties(i)
    free, total = torch.cuda.mem_get_info(i)
    print(
        f"GPU {i}: {p.name}, sm_{p.major}{p.minor}, {p.multi_processor_count} SMs, "
        f"{total / 2**30:.1f} GiB ({free / 2**30:.1f} free)"
    )
if not torch.cuda.is_available() and not DRY:
    print(f"STOP: torch {torch.__version__} (CUDA build {torch.version.cuda}) sees no CUDA device; no later step can run")
    sys.exit(1)
cc = os.environ.get("CC") or shutil.which("gcc") or shutil.which("cc") or shutil.which("clang")
inc = Path(sysconfig.get_paths()["include"]) / "Python.h"
print(
    f"Triton's launcher needs a C compiler: {cc or 'NONE (Triton kernels, so sage-triton, cannot launch)'}; "
    f"Python.h: {'present' if inc.exists() else f'MISSING at {inc}'}"
)

try:
    from h3core.executors.pipeline.attention import sage_build

    build = sage_build()
    print(
        f"sageattention: {build.version or 'not installed'}; functions: {', '.join(sorted(build.functions)) or '-'}"
        + (f"; {build.error}" if build.error else "")
    )
except Exception as exc:  # noqa: BLE001 - the imports below say which module fails
    print(f"sageattention: not checked: {one_line(exc)}")
failing = []
for mod in (
    "h3core",
    "h3core.runtime.settings",
    "h3core.executors.pipeline.executor",
    "h3core.executors.pipeline.kernel_probe",
    "h3core.adapters.video",
    "diffusers.modular_pipelines.minimax_h3",
    "transformers",
):
    try:
        importlib.import_module(mod)
        print(f"import {mod}: ok")
    except Exception as exc:  # noqa: BLE001
        print(f"import {mod}: FAILS: {one_line(exc)}")
        failing.append(mod)
if failing:
    # Every later step imports these: each would fail the same way, and spend the device's time doing so.
    print(f"STOP: {', '.join(failing)} do(es) not import (above); no later step can run")
    sys.exit(1)
