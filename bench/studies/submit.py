"""The submit path, this checkout against another commit, in one run: one client posting jobs
one after another to `h3core serve`, and the server's CPU per submit.

    python -m bench.studies.submit                         # against 3ac7012 (the first round's last commit)
    python -m bench.studies.submit --against HEAD~5 --submits 2000 --rounds 4

Each checkout's server is the real one (bench.throughput.http_load.Server: `python -m h3core.cli serve`, the
zero-time fake executor, 16 slots, a fresh store), started with PYTHONPATH at that checkout; the
other commit is checked out with `git worktree add --detach` under --workdir. Rounds alternate
between the two so that load from elsewhere on the machine falls on both alike. Roles: `all` (the
runner in the same process runs each job to done while the next submits arrive) and `api` (the
HTTP API alone, its runner not started: every job stays queued; the server answers /healthz).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import anyio

from bench.common import ROOT, ms, parse, pct, print_load_at_end, print_machine, show, table
from bench.throughput.http_load import SUBMIT_BODY, Server, cpu_seconds


@dataclass
class Side:
    name: str
    code: Path
    cpu_ms: dict[str, list[float]] = field(default_factory=dict)  # role -> per round
    latency: dict[str, list[float]] = field(default_factory=dict)  # role -> every submit


async def _post(url: str, n: int) -> list[float]:
    body, headers, out = json.dumps(SUBMIT_BODY).encode(), {"Content-Type": "application/json"}, []
    async with aiohttp.ClientSession(url, connector=aiohttp.TCPConnector(limit=1)) as client:
        for _ in range(n):
            t0 = time.perf_counter()
            async with client.post("/v1/jobs", data=body, headers=headers) as r:
                await r.read()
                if r.status != 201:
                    raise SystemExit(f"POST /v1/jobs answered {r.status}: {await r.text()}")
            out.append(time.perf_counter() - t0)
    return out


def _round(side: Side, role: str, root: Path, submits: int, warmup: int) -> None:
    shutil.rmtree(root, ignore_errors=True)  # a reused --workdir: each round starts from an empty store
    root.mkdir(parents=True)
    server = Server(db=root / "h3.db", root=root, slots=16, role=role, code=side.code)
    server.start(probe="healthz")
    try:
        anyio.run(_post, server.url, warmup)
        assert server.proc is not None
        cpu0 = cpu_seconds(server.proc.pid)
        lat = anyio.run(_post, server.url, submits)
        side.cpu_ms.setdefault(role, []).append(1000 * (cpu_seconds(server.proc.pid) - cpu0) / submits)
        side.latency.setdefault(role, []).extend(lat)
    finally:
        server.stop()


def _checkout(ref: str, workdir: Path) -> Path:
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True, text=True)
    path = workdir / f"h3core-{sha.stdout.strip()}"
    if not path.exists():
        subprocess.run(["git", "-C", str(ROOT), "worktree", "add", "--detach", str(path), ref], check=True, capture_output=True)
    return path


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--against", default="3ac7012", help="the commit to compare with (default 3ac7012)")
    ap.add_argument("--submits", type=int, default=1000, help="measured submits per round (default 1000)")
    ap.add_argument("--warmup", type=int, default=200, help="submits before each round's measurement (default 200)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per checkout and role, alternating (default 3)")
    ap.add_argument("--roles", default="all,api", help="comma-separated H3_ROLEs (default all,api)")
    ap.add_argument("--workdir", type=Path, default=None, help="stores and the other checkout (default: a new temp dir)")
    ap.add_argument("--against-path", type=Path, default=None, help="a checkout of --against already on disk (no git worktree)")
    args = parse(ap, argv, __spec__.name)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-submit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print_machine(workdir, "bench.studies.submit: sequential POST /v1/jobs, this checkout against " + args.against)
    head = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], check=True, capture_output=True, text=True)
    dirty = subprocess.run(["git", "-C", str(ROOT), "status", "--porcelain", "h3core"], capture_output=True, text=True).stdout
    sides = [Side(f"{head.stdout.strip()}{' + changes' if dirty else ''} (this checkout)", ROOT)]
    sides.append(Side(args.against, args.against_path or _checkout(args.against, workdir)))
    roles = [r for r in args.roles.split(",") if r]
    for k in range(args.rounds):
        for role in roles:
            for side in sides if k % 2 == 0 else sides[::-1]:
                _round(side, role, workdir / f"r{k}-{role}-{sides.index(side)}", args.submits, args.warmup)
    t = table(
        f"Sequential submits, {args.rounds} rounds x {args.submits} per checkout and role, alternating",
        ["role", "checkout", "server CPU ms / submit (each round)", "median", "latency p50 ms", "p90 ms", "p99 ms"],
        left=2,
        caption="server CPU: utime + stime of the server process over the round / submits (with role all, it includes "
        "running each job to done). latency: client send to whole response, every measured submit of every round.",
    )
    for role in roles:
        for side in sides:
            cpu, lat = side.cpu_ms[role], side.latency[role]
            t.add_row(
                role,
                side.name,
                " ".join(f"{c:.2f}" for c in cpu),
                f"{statistics.median(cpu):.2f}",
                ms(pct(lat, 50)),
                ms(pct(lat, 90)),
                ms(pct(lat, 99)),
            )
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
