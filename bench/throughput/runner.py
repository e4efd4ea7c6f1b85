"""Runner throughput with a zero-time fake executor: how many jobs/s the machinery itself sustains.

    python -m bench.throughput.runner                                  # 2000 jobs, slots 1/4/16, durable False/True
    python -m bench.throughput.runner --jobs 100                       # a quick look
    python -m bench.throughput.runner --jobs 10000 --slots 16 --durable false   # a deep backlog

For each `durable` x `slots` pair: a fresh `SQLiteEventStore(path, durable=...)`,
`FakeExecutor(LocalArtifactStore(dir), default=FakePlan(step_seconds=0))` and
`Runner(store, executor, RunnerConfig(slots=K, poll_interval_s=--poll))`. Every job requests
64x64, 24 frames, `--steps` steps and seed 0: the fake encodes that mp4 once (warmed up, untimed,
through the executor's own `run`) and then writes the same bytes for each job through the artifact
store (write, fsync, rename, sha256). Nothing else is mocked. Every job is submitted before the
runner starts, so the first claims see the whole backlog.

1. submit: `await runner.submit(request)` `--jobs` times, one after another, before the runner
   starts (one append of `Submitted` + `Admitted` each, through the runner's writer thread).
2. run: `await tg.start(runner.run)` (executor start and recovery included), then the bench polls
   `store.counts()` every `--check` seconds until every job is terminal, and cancels the task group.

Figures: submit jobs/s (jobs submitted per second of the submit phase); run jobs/s and run
events/s (jobs, and their `Running`, `Progress` x steps, `Done` events, per second of the run
phase; the completion poll adds up to `--check` seconds); overall jobs/s and events/s (both phases,
all `steps + 4` events per job); attempt p50 / p99 ms (from each job's `Running` to its `Done` in
the log: how long a job held a slot, including waiting for the store's single writer and the
artifact write); run CPU/wall (process CPU time / wall time of the run phase; a 2-core machine has
2.0 to give); checks (every job `done`, `jobs x (steps + 4)` events stored, one artifact per job).

The ceiling to compare against is bench.throughput.store's single-caller append rate for the same
`durable` setting: the runner writes every event through one writer thread, so its events/s can
only approach that figure; the gap is the runner's own machinery (thread hops, task groups, claims
through `store.queued()`, the artifact write).
"""

from __future__ import annotations

import argparse
import gc
import shutil
import tempfile
import time
from pathlib import Path

import anyio

from bench.common import Timer, console, ms, parse, pct, print_load_at_end, print_machine, rate, show, table
from h3core import (
    FakeExecutor,
    FakePlan,
    GenerationRequest,
    JobSpec,
    LocalArtifactStore,
    Runner,
    RunnerConfig,
    SQLiteEventStore,
)
from h3core.domain.state import TERMINAL


def bench_request(steps: int) -> GenerationRequest:
    # Constant seed and shape: the fake encodes the mp4 once and reuses the bytes for every job.
    return GenerationRequest(prompt="bench: a red fox in snow", width=64, height=64, frames=24, steps=steps, seed=0)


async def run_config(
    workdir: Path,
    *,
    jobs: int,
    steps: int,
    slots: int,
    durable: bool,
    poll_s: float,
    check_s: float,
) -> dict:
    tag = f"s{slots}-{'durable' if durable else 'fast'}"
    db = workdir / f"runner-{tag}.db"
    for suffix in ("", "-wal", "-shm"):
        Path(f"{db}{suffix}").unlink(missing_ok=True)
    art_dir = workdir / f"artifacts-{tag}"
    shutil.rmtree(art_dir, ignore_errors=True)

    store = SQLiteEventStore(db, durable=durable)
    executor = FakeExecutor(LocalArtifactStore(art_dir), default=FakePlan(step_seconds=0))
    req = bench_request(steps)
    # Warm the fake's video cache through its public run(), so no job pays the one-off encode.
    async for _ in executor.run(JobSpec("warmup", 1, req)):
        pass
    runner = Runner(store, executor, RunnerConfig(slots=slots, poll_interval_s=poll_s))
    try:
        gc.collect()
        with Timer() as t_submit:
            for _ in range(jobs):
                await runner.submit(req)

        async with anyio.create_task_group() as tg:
            with Timer() as t_run:
                t0 = time.perf_counter()
                await tg.start(runner.run)
                t_started = time.perf_counter() - t0
                polls = 0
                while True:
                    counts = store.counts()
                    polls += 1
                    if sum(n for status, n in counts.items() if status in TERMINAL) >= jobs:
                        break
                    await anyio.sleep(check_s)
            tg.cancel_scope.cancel()

        # Checks and per-job timings from the log itself (untimed).
        counts = store.counts()
        events = 0
        running_at: dict[str, float] = {}
        attempt_s: list[float] = []
        first_running = last_done = None
        for e in store.all_events():
            events += 1
            if e.type == "running":
                running_at[e.job_id] = e.at.timestamp()
                first_running = min(first_running or e.at.timestamp(), e.at.timestamp())
            elif e.type == "done":
                attempt_s.append(e.at.timestamp() - running_at[e.job_id])
                last_done = max(last_done or 0.0, e.at.timestamp())
        artifacts = sum(1 for _ in art_dir.glob("*/attempt-1.mp4")) - 1  # minus the warm-up
    finally:
        store.close()
    ok = counts == {"done": jobs} and events == jobs * (steps + 4) and artifacts == jobs
    return {
        "slots": slots,
        "durable": durable,
        "submit_s": t_submit.s,
        "submit_cpu": t_submit.cpu,
        "run_s": t_run.s,
        "run_cpu": t_run.cpu,
        "started_s": t_started,
        "events": events,
        "attempt_s": attempt_s,
        "log_span_s": (last_done or 0) - (first_running or 0),
        "polls": polls,
        "ok": ok,
        "counts": counts,
        "artifacts": artifacts,
    }


async def main_async(args: argparse.Namespace, workdir: Path) -> list[dict]:
    results = []
    for durable in args.durable:
        for slots in args.slots:
            r = await run_config(
                workdir,
                jobs=args.jobs,
                steps=args.steps,
                slots=slots,
                durable=durable,
                poll_s=args.poll,
                check_s=args.check,
            )
            flag = "" if r["ok"] else f"  CHECK FAILED: counts {r['counts']}, {r['events']} events, {r['artifacts']} artifacts"
            console.print(f"  durable={durable} slots={slots}: run {r['run_s']:.2f} s{flag}")
            results.append(r)
    return results


def parse_bools(text: str) -> list[bool]:
    return [{"true": True, "false": False}[w.strip().lower()] for w in text.split(",")]


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--workdir", type=Path, default=None, help="DB and artifacts go here (default: a new temp dir)")
    ap.add_argument("--jobs", type=int, default=2000, help="jobs per configuration (default 2000)")
    ap.add_argument("--steps", type=int, default=5, help="denoising steps per job = Progress events (default 5)")
    ap.add_argument("--slots", type=lambda s: [int(x) for x in s.split(",")], default=[1, 4, 16], help="default 1,4,16")
    ap.add_argument("--durable", type=parse_bools, default=[False, True], help="default false,true")
    ap.add_argument("--poll", type=float, default=0.05, help="RunnerConfig.poll_interval_s (default 0.05)")
    ap.add_argument("--check", type=float, default=0.01, help="how often the bench polls store.counts() (default 0.01 s)")
    args = parse(ap, argv, __spec__.name)

    workdir = args.workdir or Path(tempfile.mkdtemp(prefix="h3bench-runner-"))
    workdir.mkdir(parents=True, exist_ok=True)
    print_machine(workdir, "h3core runner benchmark")
    per_job = args.steps + 4
    console.print(
        f"{args.jobs} jobs per configuration, {args.steps} steps each (zero-time FakeExecutor, 64x64x24 mp4): "
        f"{per_job} events per job (Submitted, Admitted, Running, {args.steps} x Progress, Done); "
        f"poll_interval_s={args.poll}, completion checked every {args.check} s with store.counts().\n"
    )
    results = anyio.run(main_async, args, workdir)

    caption = (
        "submit: `await runner.submit(req)` one after another before the runner starts (one append of "
        "Submitted+Admitted each). run: from `await tg.start(runner.run)` until store.counts() shows every job "
        f"terminal ({args.steps + 2} events per job: Running, Progress x {args.steps}, Done). overall: submit + run, "
        f"all {per_job} events per job. attempt: Running->Done timestamps in the log, i.e. how long a job held a slot "
        "(includes waiting for the single store writer). CPU/wall: process CPU / wall time during run (2 cores = 2.0 max). "
        "checks: every job 'done', every event stored, one artifact per job. Compare rows with each other, and with "
        "bench.throughput.store's single-caller append rates (the runner writes through one writer thread)."
    )
    t = table(
        f"Runner throughput: {args.jobs} jobs x {args.steps} steps, zero-time fake executor",
        [
            "durable",
            "slots",
            "submit jobs/s",
            "run jobs/s",
            "run events/s",
            "overall jobs/s",
            "overall events/s",
            "attempt p50 ms",
            "attempt p99 ms",
            "run CPU/wall",
            "checks",
        ],
        caption=caption,
    )
    for r in results:
        jobs = args.jobs
        run_events = jobs * (args.steps + 2)  # Running, Progress..., Done
        total_s = r["submit_s"] + r["run_s"]
        t.add_row(
            str(r["durable"]),
            str(r["slots"]),
            rate(jobs, r["submit_s"]),
            rate(jobs, r["run_s"]),
            rate(run_events, r["run_s"]),
            rate(jobs, total_s),
            rate(r["events"], total_s),
            ms(pct(r["attempt_s"], 50)),
            ms(pct(r["attempt_s"], 99)),
            f"{r['run_cpu'] / r['run_s']:.2f}",
            "OK" if r["ok"] else "FAILED",
        )
    show(t)
    print_load_at_end()


if __name__ == "__main__":
    main()
