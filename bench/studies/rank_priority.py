"""A group of ranks beside busy processes: Ray's worker niceness (15, its default) against h3core's (0).

    python -m bench.studies.rank_priority [--hogs 0,2] [--builds 1]

For each number of busy loops (`while True: pass` processes at normal priority) and each niceness,
a child process starts a Ray of its own (`cluster.connect`, loopback, the niceness set through
`cluster.RANK_NICENESS`), builds a 2-rank FSDP2 + Ulysses group of the tiny random model on CPU
(gloo) `--builds` times, and runs one 3-step job on each. Prints a table: the ranks' niceness as
read inside them, seconds to build the group, and to run the job.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, console, parse, print_load_at_end, print_machine, show, table

REQUEST = {"prompt": "a red fox runs through deep snow!", "width": 64, "height": 64, "frames": 22, "steps": 3, "seed": 11}


def child(niceness: int, builds: int, model: str) -> None:
    """One Ray, `builds` groups one after the other; one JSON line per build on stdout."""
    from concurrent.futures import ThreadPoolExecutor

    import ray

    from h3core.domain.request import GenerationRequest
    from h3core.domain.topology import GroupPlan
    from h3core.executors.distributed import cluster
    from h3core.executors.distributed.group import Group
    from h3core.executors.distributed.rank import Payload, RankSpec
    from h3core.executors.pipeline.generate import Control

    cluster.RANK_NICENESS = niceness
    host = cluster.RayHost(cluster.ClusterSettings(cpus=4), ranks=2)
    with ThreadPoolExecutor(max_workers=1) as asker:
        asker.submit(host.connect).result()
    try:
        payload = Payload(request=GenerationRequest(**REQUEST).model_dump(mode="json"), files={}, keep_raw=False)
        for _ in range(builds):
            group = Group(GroupPlan(index=0, devices=(0, 1)), RankSpec(model_dir=model, fsdp=True, ulysses=True, threads=1))
            t0 = time.monotonic()
            group.build()
            built = time.monotonic()
            seen = [a.__ray_call__.remote(lambda worker: os.nice(0)) for a in group.actors]
            nice = sorted(set(ray.get(seen, timeout=60)))
            t1 = time.monotonic()
            out = group.run(payload, Control(), stop_timeout_s=600)
            ran = time.monotonic()
            group.teardown()
            row = {"build_s": built - t0, "run_s": ran - t1, "steps": (out or {}).get("steps"), "nice": nice}
            print(json.dumps(row), flush=True)
    finally:
        host.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hogs", default="0,2", help="numbers of busy loops to run beside, comma-separated")
    parser.add_argument("--builds", type=int, default=1)
    parser.add_argument("--niceness", default="15,0", help="worker niceness of each row, comma-separated (default 15,0)")
    parser.add_argument("--model-dir", help="the tiny random model's folder (default: written in a new temp dir)")
    parser.add_argument("--child", nargs=2, metavar=("NICENESS", "MODEL"), help=argparse.SUPPRESS)
    args = parse(parser, argv, __spec__.name)
    if args.child:
        child(int(args.child[0]), args.builds, args.child[1])
        return
    from h3core.executors.pipeline.tiny import make_tiny

    work = Path(tempfile.mkdtemp(prefix="h3-rank-priority-"))
    model = args.model_dir or make_tiny(work / "tiny")
    print_machine(work, "rank priority beside busy processes")
    t = table(
        f"A 2-rank group (FSDP2 + Ulysses, gloo, tiny model), {args.builds} build(s) per row",
        ["busy loops", "worker niceness asked", "niceness in the ranks", "build s (each)", "3-step job s (each)"],
        left=2,
    )
    for hogs in [int(h) for h in args.hogs.split(",")]:
        for niceness in [int(n) for n in args.niceness.split(",")]:
            loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(hogs)]
            try:
                out = subprocess.run(
                    [sys.executable, "-m", __spec__.name, "--builds", str(args.builds), "--child", str(niceness), str(model)],
                    capture_output=True,
                    text=True,
                    timeout=3600,
                    cwd=ROOT,
                )
            finally:
                for loop in loops:
                    loop.kill()
                    loop.wait()
            rows = [json.loads(line) for line in out.stdout.splitlines() if line.startswith("{")]
            if out.returncode or not rows:
                console.print(out.stdout[-2000:], out.stderr[-4000:])
                raise SystemExit(f"the child for {hogs} loops, niceness {niceness} failed (exit {out.returncode})")
            t.add_row(
                str(hogs),
                str(niceness),
                ",".join(str(n) for n in rows[0]["nice"]),
                " ".join(f"{r['build_s']:.1f}" for r in rows),
                " ".join(f"{r['run_s']:.1f}" for r in rows),
            )
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
