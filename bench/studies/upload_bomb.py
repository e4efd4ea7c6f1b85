"""Peak memory of an upload store taking an MP4 that declares millions of samples, this checkout
against another commit (issue 38).

    .venv/bin/python -m bench.studies.upload_bomb                       # against 4b1db1d (before the fix)
    .venv/bin/python -m bench.studies.upload_bomb --samples 1e6,1e7,3e7 --against HEAD~3

Each row is one `LocalUploadStore.put` of one file as video/mp4 in a fresh process of the side's
code (`git archive` of the other commit: no worktree is made): the rise of that process's peak
resident size (VmHWM, the kernel's high-water mark, so no spike is missed) over its size with the
file's bytes already in memory, and the peak of any child it waited for (the probe's, after the
fix: ru_maxrss of RUSAGE_CHILDREN, its whole size, PyAV's ~31 MiB included). The files: `stz2`
bombs (4-bit sample sizes, two a byte, `h3core.testing.uploads.mp4_bomb`), one constant-size
`stsz` bomb (0.7 KB for any count), and a real 2-second MP4 (PyAV), which must still be kept.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from collections.abc import Callable
from functools import partial
from pathlib import Path

from bench.common import ROOT, export, parse, print_load_at_end, print_machine, show, table

# Run in a fresh process with the side's code first on sys.path: argv = file, max_samples or "-".
MEASURE = """
import asyncio, json, resource, sys, time
from pathlib import Path
from h3core.adapters.uploads import LocalUploadStore, UploadRejected

def peak():
    with open("/proc/self/status") as status:
        return next(int(line.split()[1]) * 1024 for line in status if line.startswith("VmHWM:"))

async def body(data):
    for i in range(0, len(data), 1 << 16):
        yield data[i : i + (1 << 16)]

data = Path(sys.argv[1]).read_bytes()
kw = {} if sys.argv[2] == "-" else {"max_samples": int(sys.argv[2])}
store = LocalUploadStore(Path(sys.argv[1]).with_suffix(".store"), **kw)
before, start = peak(), time.perf_counter()
try:
    upload = asyncio.run(store.put("video/mp4", body(data)))
    answer = f"kept: {upload.width}x{upload.height}, {upload.seconds:g} s"
except UploadRejected as exc:
    answer = f"{exc.status}: {str(exc).split(';')[0]}"
child = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss * 1024
print(json.dumps({"rise": peak() - before, "child": child, "answer": answer, "s": time.perf_counter() - start}))
"""


def measure(code: Path, file: Path, max_samples: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(code)}
    # cwd: `-c` puts it first on sys.path, and this checkout's h3core is not to shadow the other's.
    command = [sys.executable, "-c", MEASURE, str(file), max_samples]
    ran = subprocess.run(command, capture_output=True, text=True, env=env, cwd=file.parent, check=False)
    if ran.returncode != 0:
        return {"answer": f"process failed: {ran.stderr.strip().splitlines()[-1:]}", "rise": 0, "child": 0, "s": 0}
    return json.loads(ran.stdout)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="4b1db1d", help="the commit to compare with (default 4b1db1d, before the fix)")
    ap.add_argument("--samples", default="1e6,5e6,1e7,3e7", help="declared samples of the stz2 bombs (default 1e6,5e6,1e7,3e7)")
    ap.add_argument("--workdir", type=Path, default=None, help="files and the other commit's code (default: a new temp dir)")
    args = parse(ap, argv, __spec__.name)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-bomb-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print_machine(workdir, f"upload_bomb: peak memory of LocalUploadStore.put, this checkout against {args.against}")

    from h3core.testing.uploads import mp4, mp4_bomb

    files: list[tuple[str, Path, Callable[[], bytes]]] = [
        (f"stz2, {n:,} samples", workdir / f"stz2-{n}.mp4", partial(mp4_bomb, n))
        for n in (int(float(x)) for x in args.samples.split(","))
    ]
    files.append(("stsz, 10,000,000 samples", workdir / "stsz.mp4", partial(mp4_bomb, 10_000_000, compact=False)))
    files.append(("real: 64x48, 48 frames + AAC", workdir / "real.mp4", partial(mp4, 64, 48, frames=48)))
    for _, path, make in files:
        if not path.exists():
            path.write_bytes(make())

    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "h3core"], capture_output=True, text=True).stdout
    sides = [
        (f"{args.against}", export(args.against, workdir), "-"),
        (f"{head.stdout.strip()}{' + changes' if dirty else ''}", ROOT, "-"),
        (f"{head.stdout.strip()}, tables let through (max_samples 1e9)", ROOT, str(10**9)),
    ]
    for name, code, bound in sides:
        t = table(
            f"{name}: LocalUploadStore.put of one file as video/mp4",
            ["file", "bytes", "answer", "store peak rise (MiB)", "probe child peak (MiB)", "s"],
            left=3,
            caption="store peak rise: VmHWM after the put less before it, in the store's process; "
            "probe child peak: the largest child's whole resident peak (0: none was started).",
        )
        for label, path, _ in files:
            found = measure(code, path, bound)
            t.add_row(
                label,
                f"{path.stat().st_size:,}",
                found["answer"],
                f"{found['rise'] / 2**20:.0f}",
                f"{found['child'] / 2**20:.0f}",
                f"{found['s']:.2f}",
            )
        show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
