"""What the crash-safe artifact commit costs, against the first round's commit, in one run.

    python -m bench.studies.commit --commits 300 --rounds 3 --workdir /tmp/h3bcommit

Each commit is what the zero-time fake executor does at the end of a job: a small video written
to its staging name, then committed. `LocalArtifactStore.commit` (the video fsynced, its record
written and fsynced under the final name, both renamed, the folder fsynced once: a complete video
always has its record) against the first round's commit (3ac7012: the video fsynced and renamed,
no record, no folder fsync). Rounds alternate between the two; figures are this process's CPU
(utime + stime: an fsync's kernel work counts, the wait for the disk does not) and wall time per
commit, median over rounds. bench.studies.submit's `all` role pays this once per job.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import parse, print_load_at_end, print_machine, show, table
from h3core.adapters.artifacts import LocalArtifactStore, sha256_file

VIDEO = os.urandom(20_000)  # about the fake's 64x64 video


def first_round_commit(staged: Path) -> str:
    """3ac7012's `LocalArtifactStore.commit` (its file's size and sha256 measured after the rename)."""
    final = staged.with_name(staged.name.removesuffix(".part"))
    with open(staged, "rb") as f:
        os.fsync(f.fileno())
    os.replace(staged, final)
    return sha256_file(final)


def measure(commit: Callable[[LocalArtifactStore, str], None], root: Path, n: int) -> tuple[float, float]:
    store = LocalArtifactStore(root)
    cpu0, wall0 = time.process_time(), time.perf_counter()
    for i in range(n):
        commit(store, f"job{i:08d}")
    return 1e6 * (time.process_time() - cpu0) / n, 1e6 * (time.perf_counter() - wall0) / n


def crash_safe(store: LocalArtifactStore, job_id: str) -> None:
    staged = store.staging(job_id, 1)
    staged.write_bytes(VIDEO)
    store.commit(staged, job_id=job_id, attempt=1, frames=24, duration_s=1.0)


def first_round(store: LocalArtifactStore, job_id: str) -> None:
    staged = store.staging(job_id, 1)
    staged.write_bytes(VIDEO)
    first_round_commit(staged)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--commits", type=int, default=300, help="commits per round and kind (default 300)")
    ap.add_argument("--rounds", type=int, default=3, help="rounds per kind, alternating (default 3)")
    ap.add_argument("--workdir", type=Path, default=None, help="where the artifact stores go (default: a new temp dir)")
    args = parse(ap, argv, __spec__.name)
    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-commit-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print_machine(workdir, "bench.studies.commit: the crash-safe artifact commit against the first round's")
    kinds = {"crash-safe (this checkout)": crash_safe, "first round (3ac7012)": first_round}
    got: dict[str, list[tuple[float, float]]] = {k: [] for k in kinds}
    for r in range(args.rounds):
        for name in kinds if r % 2 == 0 else list(kinds)[::-1]:
            got[name].append(measure(kinds[name], Path(tempfile.mkdtemp(dir=workdir)), args.commits))
    t = table(
        f"Artifact commits of a {len(VIDEO)}-byte video, {args.rounds} rounds x {args.commits}, alternating",
        ["commit", "CPU us / commit (each round)", "median", "wall us / commit (median)"],
        caption="CPU: this process's utime + stime per commit (an fsync's kernel work included); wall: its elapsed time.",
    )
    for name, rows in got.items():
        cpu, wall = [c for c, _ in rows], [w for _, w in rows]
        t.add_row(name, " ".join(f"{c:.0f}" for c in cpu), f"{statistics.median(cpu):.0f}", f"{statistics.median(wall):.0f}")
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
