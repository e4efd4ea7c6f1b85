"""Step 3: the kernel table. One attention call per kernel at MiniMax-H3's geometry (56 heads x 128,
bf16, batch 1) through the product's own path (`attention.plan_for(kernel).attend`: the plan's
guard, diffusers' dispatch, the installed SageAttention function), at 8k-128k tokens and at
lengths that are not multiples of 64.

Per cell: median ms of the timed calls after one warm-up (CUDA events), the allocator's peak
during a call above what was allocated before it, and the relative L1 error (sum|out - ref| /
sum|ref|) against float32 softmax attention: every query row up to 8229 tokens, 512 sampled rows
above (the reference of all 128k rows would not fit). Each sage kernel runs in its own process
(a crash there loses no other row), the SDPA kernels share one; each worker has a deadline and
skips what would overrun it, saying so. MATH runs only where its score matrix fits.

    python kernels.py             # the driver: runs the workers, writes kernels.md and kernels.jsonl
"""

from __future__ import annotations

import argparse
import json
import math
import os
import subprocess
import sys
import time

from bench.gpu.common import DEVICE, DRY, DTYPE, OUT, REAL_GEOMETRY, WORK, md, one_line, trace

HEADS, DIM = (4, 64) if DRY else REAL_GEOMETRY
SEQS = [256, 512] if DRY else [8192, 16384, 32768, 65536, 131072]
UNALIGNED = [135, 300] if DRY else [135, 300, 8192 + 37]  # 57, 20 and 27 padded keys in the last 64-key block
FULL_REFERENCE_UPTO = 8229  # beyond: the error on SAMPLED query rows
SAMPLED = 512
MATH_BYTES = 0.05e9 if DRY else 40e9  # MATH's score matrix (heads x n^2 x 4 bytes) must fit in this
REPS = 3
WORKERS = [
    ("sdpa", ["cudnn", "flash", "efficient", "math"]),
    ("sage-fp16", ["sage-fp16"]),
    ("sage-fp8", ["sage-fp8"]),
    ("sage-triton", ["sage-triton"]),
]
SHARE = {"sdpa": 0.55, "sage-fp16": 0.15, "sage-fp8": 0.15, "sage-triton": 0.15}
# H3GPU_KERNELS_ONLY=sage-fp16,sage-fp8: only these (the check's step 8b, after SageAttention 2 is built).
ONLY = {k for k in os.environ.get("H3GPU_KERNELS_ONLY", "").split(",") if k}
if ONLY:
    WORKERS = [(name, [k for k in ks if k in ONLY]) for name, ks in WORKERS if any(k in ONLY for k in ks)]


def log(msg: str) -> None:
    print(msg, file=sys.stderr, flush=True)


def label(n: int) -> str:
    return f"{n // 1024}k" if n >= 1024 and n % 1024 == 0 else str(n)


# ----------------------------------------------------------------------------------------- worker
def worker(name: str, kernels: list[str], deadline: float) -> None:
    import torch

    from h3core.executors.pipeline.attention import AttentionError, Target, plan_for
    from h3core.executors.pipeline.kernel_probe import reference, relative_error, time_call

    target = Target.detect(DEVICE, DTYPE, HEADS, DIM)
    sink = (WORK / f"kernels-{name}.jsonl").open("a")

    def emit(rec: dict) -> None:
        sink.write(json.dumps(rec) + "\n")
        sink.flush()

    def inputs(n: int):
        g = torch.Generator(device=target.device).manual_seed(n)
        return [torch.randn(1, n, HEADS, DIM, generator=g, device=target.device, dtype=getattr(torch, DTYPE)) for _ in range(3)]

    def sync():
        if target.kind == "cuda":
            torch.cuda.synchronize()

    def cell(kernel, plan, n: int, timed: bool, last: dict) -> dict:
        rec = {"kernel": kernel, "tokens": n, "heads": HEADS, "dim": DIM, "dtype": DTYPE, "device": target.name}
        if kernel == "math" and HEADS * n * n * 4 > MATH_BYTES:
            return {**rec, "status": "skipped", "note": f"MATH's score matrix would be {HEADS * n * n * 4 / 2**30:.0f} GiB"}
        est = last.get(kernel)
        if timed and est is not None:
            n0, ms0 = est
            need = ms0 * (n / n0) ** 2 * (1 + REPS) / 1000 + 2
            if time.time() + need > deadline:
                return {**rec, "status": "skipped", "note": f"time budget (~{need:.0f} s, {deadline - time.time():.0f} s left)"}
        if time.time() > deadline:
            return {**rec, "status": "skipped", "note": "time budget"}
        q, k, v = inputs(n)
        try:
            out = plan.attend(q, k.clone(), v)  # a fresh k: SageAttention subtracts k's mean in place
            sync()
            rows = None if n <= FULL_REFERENCE_UPTO else torch.randperm(n, device=q.device)[:SAMPLED]
            ref = reference(q, k, v, rows)
            rec["error"] = relative_error(out[:, rows] if rows is not None else out, ref)
            rec["rows"] = "all" if rows is None else SAMPLED
            rec["out_abs_ratio"] = float((out[:, rows] if rows is not None else out).float().abs().sum() / ref.abs().sum())
            del out, ref
            if timed:  # the probe's own timer; the call above was the warm-up
                rec["ms"], rec["peak_bytes"] = time_call(plan.attend, target, q, k, v, warm=0, reps=REPS)
                rec["tflops"] = 4 * n * n * HEADS * DIM / (rec["ms"] / 1000) / 1e12
                last[kernel] = (n, rec["ms"])
            rec["status"] = "ok"
        except torch.cuda.OutOfMemoryError as exc:
            rec.update(status="oom", note=one_line(exc, 200))
        except Exception as exc:  # noqa: BLE001 - a row that says what the kernel raised
            trace(exc)
            rec.update(status="error", note=one_line(exc, 300))
        finally:
            del q, k, v
            if target.kind == "cuda":
                torch.cuda.empty_cache()
        return rec

    last: dict = {}
    plans = {}
    for kernel in kernels:
        try:
            plans[kernel] = plan_for(kernel, target, math_max_tokens=10**9)
        except AttentionError as exc:
            emit({"kernel": kernel, "status": "unsupported", "note": str(exc)})
    # The unaligned lengths first: cheap, and they compile any Triton kernel before anything is timed.
    for n in UNALIGNED:
        for kernel, plan in plans.items():
            emit(cell(kernel, plan, n, timed=False, last=last))
    for n in SEQS:
        for kernel, plan in plans.items():
            rec = cell(kernel, plan, n, timed=True, last=last)
            log(f"[kernels {name}] {kernel} {label(n)}: {rec['status']} {rec.get('ms', '')}")
            emit(rec)
    sink.close()


# ----------------------------------------------------------------------------------------- driver
def drive(budget: float) -> int:
    from h3core.executors.pipeline.attention import AttentionError, Target, plan_for

    WORK.mkdir(parents=True, exist_ok=True)
    for f in WORK.glob("kernels-*.jsonl"):
        f.unlink()
    end = time.time() + budget
    target = Target.detect(DEVICE, DTYPE, HEADS, DIM)
    workers = []
    for name, kernels in WORKERS:  # a kernel this machine cannot run needs no worker: its row says why
        runnable = []
        for kernel in kernels:
            try:
                plan_for(kernel, target)
                runnable.append(kernel)
            except AttentionError as exc:
                with (WORK / f"kernels-{name}.jsonl").open("a") as f:
                    f.write(json.dumps({"kernel": kernel, "status": "unsupported", "note": str(exc)}) + "\n")
        if runnable:
            workers.append((name, runnable))
    for i, (name, kernels) in enumerate(workers):
        left = end - time.time()
        share = left * SHARE[name] / sum(SHARE[w] for w, _ in workers[i:])
        if share < 8:
            note(name, kernels, f"not started: {left:.0f} s of the step's budget left")
            continue
        cmd = [
            sys.executable,
            "-m",
            "bench.gpu.kernels",
            "--worker",
            name,
            "--kernels",
            ",".join(kernels),
            "--deadline",
            f"{time.time() + share - 3:.1f}",
        ]
        t0 = time.time()
        try:
            rc = subprocess.run(cmd, timeout=share + 5).returncode
        except subprocess.TimeoutExpired:
            rc = "timeout"
        log(f"[kernels] worker {name}: rc {rc} after {time.time() - t0:.0f} s (share {share:.0f} s)")
        if rc != 0:
            note(
                name,
                kernels,
                f"worker exited {rc} after {time.time() - t0:.0f} s (cells it did not report are missing; see run.log)",
            )
    return report()


def note(name: str, kernels: list[str], text: str) -> None:
    with (WORK / f"kernels-{name}.jsonl").open("a") as f:
        for k in kernels:
            f.write(json.dumps({"kernel": k, "worker_note": text}) + "\n")


def report() -> int:
    recs = []
    for name, _ in WORKERS:
        path = WORK / f"kernels-{name}.jsonl"
        if path.exists():
            recs += [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    OUT.mkdir(parents=True, exist_ok=True)
    (OUT / "kernels.jsonl").write_text("".join(json.dumps(r) + "\n" for r in recs))
    cells = {(r["kernel"], r["tokens"]): r for r in recs if "tokens" in r}
    order = [k for _, ks in WORKERS for k in ks]
    why = {r["kernel"]: r["note"] for r in recs if r.get("status") == "unsupported"}
    notes = {r["kernel"]: r["worker_note"] for r in recs if "worker_note" in r}
    device = next((r["device"] for r in recs if "device" in r), DEVICE)

    def show(r: dict | None, what: str, kernel: str) -> str:
        if r is None:
            return "unsupported" if kernel in why else "-"
        if r.get("status") != "ok":
            return f"{r.get('status')}: {r.get('note', '')[:70]}"
        if what == "time":
            mem = f" / {r['peak_bytes'] / 2**30:.2f} GiB" if r.get("peak_bytes") is not None else ""
            return f"{r['ms']:,.1f} ms{mem}"
        return f"{r['error']:.1e}" if math.isfinite(r["error"]) else "not finite"

    from h3core.executors.pipeline.kernel_probe import UNVERIFIED, UNVERIFIED_NOTE

    ran = {r["kernel"] for r in cells.values() if r.get("status") == "ok"}
    print(f"## The kernel table: one attention call, {HEADS} heads x {DIM}, {DTYPE}, batch 1, {device}\n")
    for k in sorted(UNVERIFIED & set(order)):
        state = "ran in this table (on a GPU: a run to record in bench/RESULTS.md)" if k in ran and not DRY else UNVERIFIED_NOTE
        print(f"- {k}: {state}")
    print()
    print(f"Time: median of {REPS} calls after one warm-up / the allocator's peak during the call above its inputs.\n")
    print(
        md(
            ["kernel", *(f"{label(n)} tokens" for n in SEQS)],
            [[k, *(show(cells.get((k, n)), "time", k) for n in SEQS)] for k in order],
        )
    )
    print(
        "\nRelative L1 error against float32 softmax attention (all query rows up to 8229 tokens, "
        f"{SAMPLED} sampled above); the start-up probe's tolerance is 0.05.\n"
    )
    lengths = sorted({*UNALIGNED, *SEQS})
    print(
        md(
            ["kernel", *(f"{n} ({-n % 64} pad)" for n in lengths)],
            [[k, *(show(cells.get((k, n)), "error", k) for n in lengths)] for k in order],
        )
    )
    print("\nsum|out| / sum|ref| at the unaligned lengths (1 = right; below 1 = padded keys took softmax weight):\n")

    def ratio(k: str, n: int) -> str:
        r = cells.get((k, n))
        return f"{r['out_abs_ratio']:.3f}" if r and r.get("status") == "ok" else show(r, "error", k)

    print(md(["kernel", *map(str, UNALIGNED)], [[k, *(ratio(k, n) for n in UNALIGNED)] for k in order]))
    print()
    for k in order:
        if k in why or k in notes:
            print(f"- {k}: {why.get(k) or ''} {notes.get(k) or ''}".rstrip())
    ok = any(r.get("status") == "ok" for r in cells.values())
    return 0 if ok else 1


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--worker")
    p.add_argument("--kernels")
    p.add_argument("--deadline", type=float)
    p.add_argument("--budget", type=float, default=float(os.environ.get("H3GPU_KERNELS_BUDGET", "120")))
    a = p.parse_args()
    if a.worker:
        worker(a.worker, a.kernels.split(","), a.deadline)
    else:
        sys.exit(drive(a.budget))


if __name__ == "__main__":
    main()
