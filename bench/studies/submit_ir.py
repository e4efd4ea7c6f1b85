"""Instructions per submit, this checkout against another commit: a count that load does not move.

    python -m bench.studies.submit_ir                          # against 3ac7012, 200 submits each
    python -m bench.studies.submit_ir --attribute              # and this checkout with one feature off at a time

bench.studies.submit's CPU per submit moves by 10-30 % with the load from elsewhere on a shared box,
more than the differences it is after. This counts instructions instead, under valgrind's
callgrind (instrumentation on only around the measured submits): the same code does the same
count, whatever else runs. What is counted: `POST /v1/jobs` straight into each checkout's ASGI
app (`_submit_ir_child.py`: Litestar, the handler, admission, the append through the writer
thread, the answer), user-space instructions of every thread. Not counted: uvicorn and its HTTP
parser, the sockets, the kernel (fsyncs), and the runner (not started: the `api` role's work).
Then (`--server-roles`) the whole `h3core serve` process of each checkout, as bench.studies.submit
starts it, under valgrind with a client outside it: everything the process does per submit in
user space, uvicorn, the store tail and the runner included.
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import anyio

from bench.common import ROOT, parse, print_load_at_end, print_machine, show, table
from bench.studies.submit import _checkout, _post
from bench.throughput.http_load import Server

CHILD = "bench.studies._submit_ir_child"
FEATURES = ("no-log", "no-cross-site", "plain-request")
DRY = "dry run: not counted"


def _wait(path: Path, proc: subprocess.Popen, log: Path) -> None:
    while not path.exists():
        if proc.poll() is not None:
            raise SystemExit(f"the measured process ended early; its output:\n{log.read_text()[-3000:]}")
        time.sleep(0.1)


def callgrind(profile: Path, *cmd: str, dry: bool = False) -> list[str]:
    """`cmd` under valgrind's callgrind (instrumentation off until turned on, counts into `profile`); bare in a dry run."""
    return list(cmd) if dry else ["valgrind", "--tool=callgrind", "--instr-atstart=no", f"--callgrind-out-file={profile}", *cmd]


def per_submit(profile: Path, submits: int, log: Path) -> int:
    totals = [line for line in profile.read_text().splitlines() if line.startswith("totals:")]
    if not totals:
        raise SystemExit(f"no totals in {profile}; the process's output:\n{log.read_text()[-3000:]}")
    return int(totals[0].split()[1]) // submits


def instrument(pid: int, on: bool, dry: bool) -> None:
    if not dry:
        subprocess.run(["callgrind_control", "-i", "on" if on else "off", str(pid)], check=True, capture_output=True)


def count(code: Path, variant: str, submits: int, workdir: Path, dry: bool = False) -> int | None:
    """Instructions per submit of `variant` of the checkout at `code` (None in a dry run: nothing counted)."""
    out = workdir / f"{code.name}-{variant}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    profile, log = out / "callgrind.out", out / "valgrind.log"
    cmd = callgrind(profile, sys.executable, "-m", CHILD, str(code), variant, str(submits), str(out), dry=dry)
    # The checkout's h3core (and the first round's `service`) first, this repository's `bench` after
    # it; the working directory is the count's folder, so neither checkout comes first by accident.
    pythonpath = os.pathsep.join([str(code), str(ROOT)])
    env = {k: v for k, v in os.environ.items() if not k.startswith("H3_")} | {"PYTHONPATH": pythonpath}
    with open(log, "wb") as sink:
        proc = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env, cwd=out)
    try:
        _wait(out / "ready", proc, log)
        instrument(proc.pid, True, dry)
        (out / "go").touch()
        _wait(out / "done", proc, log)
        instrument(proc.pid, False, dry)
        (out / "exit").touch()
        proc.wait(timeout=600)
    finally:
        if proc.poll() is None:
            proc.kill()
    return None if dry else per_submit(profile, submits, log)


def count_server(code: Path, role: str, submits: int, workdir: Path, dry: bool = False) -> int | None:
    """Instructions per submit of the whole `h3core serve` process of the checkout at `code` in
    `role` (bench.studies.submit's server: the zero-time fake executor, 16 slots, a fresh store), the
    client outside valgrind posting one submit after another."""
    root = workdir / f"server-{code.name}-{role}"
    shutil.rmtree(root, ignore_errors=True)
    root.mkdir(parents=True)
    profile = root / "callgrind.out"
    wrapper = tuple(callgrind(profile, dry=dry))
    server = Server(db=root / "h3.db", root=root, slots=16, role=role, code=code, wrapper=wrapper)
    server.start(timeout=600, probe="healthz")  # started under valgrind: minutes on a busy box
    try:
        anyio.run(_post, server.url, 50)  # warm
        assert server.proc is not None
        instrument(server.proc.pid, True, dry)
        anyio.run(_post, server.url, submits)
        instrument(server.proc.pid, False, dry)
    finally:
        server.stop()
    return None if dry else per_submit(profile, submits, server.log)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="3ac7012", help="the commit to compare with (default 3ac7012)")
    ap.add_argument("--submits", type=int, default=200, help="measured submits per count (default 200)")
    ap.add_argument(
        "--attribute", action="store_true", help="also count this checkout with each feature off: " + ", ".join(FEATURES)
    )
    ap.add_argument(
        "--server-roles",
        default="api,all",
        help="also count the whole server process in these H3_ROLEs, comma-separated ('' for none; default api,all)",
    )
    ap.add_argument("--workdir", type=Path, default=None, help="counts' folders and the other checkout (default: a new temp dir)")
    ap.add_argument("--against-path", type=Path, default=None, help="a checkout of --against already on disk (no git worktree)")
    ap.add_argument(
        "--dry-run",
        action="store_true",
        help="every step without valgrind (nothing counted): the processes, the handshake, the variants",
    )
    args = parse(ap, argv, __spec__.name)
    dry = args.dry_run
    if not dry and (shutil.which("valgrind") is None or shutil.which("callgrind_control") is None):
        raise SystemExit("valgrind (with callgrind_control) is needed: apt-get install valgrind")
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-submit-ir-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print_machine(workdir, "bench.studies.submit_ir: instructions per POST /v1/jobs, this checkout against " + args.against)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "h3core"], capture_output=True, text=True).stdout
    here = f"{head.stdout.strip()}{' + changes' if dirty else ''}"
    other = args.against_path or _checkout(args.against, workdir)
    against = count(other, "full", args.submits, workdir, dry)
    rows = [(args.against, "as it is", against), (here, "as it is", count(ROOT, "full", args.submits, workdir, dry))]
    if args.attribute:
        rows += [(here, f"{v} (attribution only)", count(ROOT, v, args.submits, workdir, dry)) for v in FEATURES]
    t = table(
        f"Instructions per POST /v1/jobs, {args.submits} submits per count (callgrind)",
        ["checkout", "variant", "instructions / submit", f"vs {args.against}", f"vs {here}"],
        left=2,
        caption="User-space instructions of every thread of one process, around the measured submits only: the "
        "Litestar app called as ASGI (no uvicorn, sockets or kernel), the runner not started. 'no-log': the runner's "
        "log records not made; 'no-cross-site': without the cross-site middleware; 'plain-request': Litestar's "
        "request instead of the body-limit one.",
    )
    full = rows[1][2]
    for name, variant, n in rows:
        if n is None or against is None or full is None:
            t.add_row(name, variant, DRY, "-", "-")
        else:
            t.add_row(name, variant, f"{n:,}", f"{100 * (n - against) / against:+.1f} %", f"{n - full:+,}")
    show(t)
    roles = [r for r in args.server_roles.split(",") if r]
    if roles:
        t = table(
            f"Instructions per POST /v1/jobs of the whole server process, {args.submits} sequential submits (callgrind)",
            ["role", args.against, here, "difference"],
            left=1,
            caption="`h3core serve` as bench.studies.submit runs it, under valgrind, instrumented around the measured submits "
            "only: every thread's user-space instructions (uvicorn and its HTTP parser, the app, the writer, the API "
            "role's store tail, metrics; with role all the runner and the fake executor too), not the kernel's.",
        )
        for role in roles:
            a, b = count_server(other, role, args.submits, workdir, dry), count_server(ROOT, role, args.submits, workdir, dry)
            if a is None or b is None:
                t.add_row(role, DRY, DRY, "-")
                continue
            t.add_row(role, f"{a:,}", f"{b:,}", f"{b - a:+,} ({100 * (b - a) / a:+.1f} %)")
        show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
