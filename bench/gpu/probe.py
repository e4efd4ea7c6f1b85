"""Step 2: what `serve` decides at start, through the product's own command (`h3core model attention`),
at MiniMax-H3's real geometry (56 heads x 128) and at the tiny model's (2 x 32), with `auto`."""

from __future__ import annotations

import subprocess
import sys

from bench.gpu.common import DEVICE, DTYPE, REAL_GEOMETRY, WORK, geometry_folder

print(f"## What `auto` chooses at start ({DEVICE}, {DTYPE})\n")
for label, (heads, head_dim) in (("MiniMax-H3", REAL_GEOMETRY), ("the tiny model", (2, 32))):
    folder = geometry_folder(heads, head_dim)
    cmd = [
        sys.executable,
        "-c",
        "from h3core.cli import main; main()",
        "model",
        "attention",
        str(folder),
        "--device",
        DEVICE,
        "--dtype",
        DTYPE,
    ]
    print(f"### {label}: {heads} heads x {head_dim}\n")
    done = subprocess.run(cmd, capture_output=True, text=True, cwd=WORK)
    print(done.stdout.strip() or "(no table)")
    if done.returncode != 0:
        print(f"\n`h3core model attention` exited {done.returncode}: {done.stderr.strip()[-1500:]}")
    print()
