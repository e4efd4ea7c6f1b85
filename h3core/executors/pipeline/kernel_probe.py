"""Which attention kernel runs, decided by measurement when the executor starts.

`decide(choice, target)`:

- A named kernel (`--attention cudnn`) must be supported here (`Kernel.unsupported`), run, and
  stay within the tolerance; otherwise `AttentionError` says what is missing or wrong and `serve`
  stops at start.
- `auto` probes every kernel this device, dtype and head dim allow, at the model's geometry: a
  kernel whose error exceeds the tolerance is rejected, the fastest accepted one is chosen. MATH
  (quadratic memory) is chosen only where no other kernel is accepted, and keeps its bound.

The error is the relative L1 distance, sum|out - ref| / sum|ref|, from a float32 reference on
the same random inputs, at an aligned length (1024) and at one that is not a multiple of 64
(135): SageAttention 1.0.6 leaves the padded keys of the last 64-key block unmasked and is 20 %
off there, 0.2 % at 8k (docs/design.md §5b). The time is the median of a few calls at a job-like
length (16k tokens on a GPU), with the allocator's peak during the call.

The decision and its table are cached in a JSON file keyed by everything they depend on
(device, dtype, geometry, tolerance, the MATH bound and the library versions), so a restart
does not measure again. `h3core model attention` prints the table; `main` is the child process's entry.

On CUDA every executor measures in a child process (`decide_in_child`): a community kernel build
that faults leaves a sticky CUDA error in its process, or kills it. The child reports each kernel
as it starts and ends it; when the child dies inside a kernel, that kernel is recorded as failed
with how the process ended, and a fresh child goes on with the kernels not yet measured (the
rows already measured are handed to it). A kernel that raises a CUDA error is failed the same
way, and the child exits if the device is unusable after it, so no later kernel is measured on a
poisoned context.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import importlib.metadata
import json
import logging
import math
import os
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path

from h3core.executors.pipeline.attention import (
    CHOICES,
    DEFAULT_MATH_MAX_TOKENS,
    KERNELS,
    AttentionError,
    AttentionPlan,
    Kernel,
    Target,
    plan_for,
)
from h3core.executors.reports import ProbeRow

log = logging.getLogger("h3core.attention")

DEFAULT_TOLERANCE = 0.05  # sage's int8 quantisation is ~1e-2 off; the 1.0.6 padding bug 0.2 at 135 tokens
ERROR_LENGTHS: tuple[int, ...] = (1024, 135)  # aligned to 64, and not: 57 padded keys in the last 64-key block
TIMED_TOKENS = {"cuda": 16384, "cpu": 1024}
REPEATS = {"cuda": (2, 5), "cpu": (1, 3)}  # warm-up calls, timed calls
PROBE_VERSION = 1  # bump when what the probe measures changes: older cache entries stop matching
# Never yet executed on a GPU by this project (no SageAttention 2 build has run in its GPU check): said
# wherever they are offered, until a GPU run has measured them (bench/gpu/README.md).
UNVERIFIED = frozenset({"sage-fp16", "sage-fp8"})
UNVERIFIED_NOTE = "unverified: never executed on a GPU by h3core's check"
STAND_INS_ENV = "H3CORE_ATTENTION_STAND_INS"  # tests only: module:function giving (kernels, calls) to the child

Call = Callable[..., object]  # (q, k, v) in diffusers' (batch, sequence, heads, head_dim) layout -> out
Progress = Callable[[str, "ProbeRow | None"], None]  # (kernel, None) before measuring it, (kernel, row) after


@dataclass(frozen=True)
class Decision:
    """The plan that runs and the probe's table behind it (one row per kernel), with the tolerance and
    lengths it was judged at; `cached` where it was read from the cache rather than measured."""

    plan: AttentionPlan
    rows: tuple[ProbeRow, ...]
    tolerance: float
    lengths: tuple[int, ...] = ERROR_LENGTHS
    cached: bool = False

    def to_json(self) -> dict:
        """The decision as the cache and the child's JSON line keep it (`cached` is left out)."""
        return {
            "plan": dataclasses.asdict(self.plan),
            "rows": [dataclasses.asdict(r) for r in self.rows],
            "tolerance": self.tolerance,
            "lengths": list(self.lengths),
        }

    @classmethod
    def from_json(cls, data: dict, *, cached: bool = False) -> Decision:
        """The decision `to_json` wrote; raises `KeyError` or `TypeError` for data of another shape."""
        return cls(
            AttentionPlan(**data["plan"]),
            tuple(ProbeRow(**r) for r in data["rows"]),
            float(data["tolerance"]),
            tuple(data["lengths"]),
            cached,
        )


# -- measuring one kernel -----------------------------------------------------------------------


def _inputs(n: int, target: Target, seed: int):
    import torch

    g = torch.Generator(device=target.device).manual_seed(seed)
    dtype = getattr(torch, target.dtype)
    shape = (1, n, target.heads, target.head_dim)
    return [torch.randn(shape, generator=g, device=target.device, dtype=dtype) for _ in range(3)]


def reference(q, k, v, rows=None):
    """Softmax attention in float32, one head at a time (its score matrix is the only big thing);
    for the query rows `rows` only when given (a sample, where all of them would not fit)."""
    import torch

    if rows is not None:
        q = q[:, rows]
    qf, kf, vf = (x.float().transpose(1, 2) for x in (q, k, v))  # (batch, heads, sequence, dim)
    out = torch.empty_like(qf)
    scale = qf.shape[-1] ** -0.5
    for h in range(qf.shape[1]):
        scores = (qf[:, h] @ kf[:, h].transpose(-1, -2)) * scale
        out[:, h] = torch.softmax(scores, dim=-1) @ vf[:, h]
    return out.transpose(1, 2)


def relative_error(out, ref) -> float:
    """sum|out - ref| / sum|ref|; infinite when the output is not finite."""
    import torch

    out = out.float()
    if not bool(torch.isfinite(out).all()):
        return math.inf
    return float((out - ref).abs().sum() / ref.abs().sum())


def _timed(call: Call, target: Target, n: int) -> tuple[float, int | None]:
    """Median ms of one call at `n` tokens, and the allocator's peak above its inputs (CUDA)."""
    warm, reps = REPEATS[target.kind]
    q, k, v = _inputs(n, target, seed=7)
    return time_call(call, target, q, k, v, warm=warm, reps=reps)


def time_call(call: Call, target: Target, q, k, v, *, warm: int, reps: int) -> tuple[float, int | None]:
    """Median ms of `reps` calls on (q, k, v) after `warm` untimed ones (CUDA events on a GPU),
    and the allocator's peak above the inputs during them (CUDA; None on a CPU)."""
    import torch

    cuda = target.kind == "cuda"
    for _ in range(warm):
        del_out = call(q, k.clone(), v)  # a fresh k: SageAttention subtracts k's mean in place
        del del_out
    times, peak = [], None
    for _ in range(reps):
        kc = k.clone()
        if cuda:
            torch.cuda.synchronize(target.device)
            base = torch.cuda.memory_allocated(target.device)
            torch.cuda.reset_peak_memory_stats(target.device)
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            out = call(q, kc, v)
            end.record()
            end.synchronize()
            times.append(start.elapsed_time(end))
            peak = max(peak or 0, torch.cuda.max_memory_allocated(target.device) - base)
        else:
            t0 = time.perf_counter()
            out = call(q, kc, v)
            times.append((time.perf_counter() - t0) * 1000)
        del out, kc
    return statistics.median(times), peak


def measure(
    kernel: str, call: Call, target: Target, *, tolerance: float, timed_tokens: int, lengths: tuple[int, ...] = ERROR_LENGTHS
) -> ProbeRow:
    """Run `call` at `lengths` against the reference, then time it: accepted, rejected or failed."""
    import torch

    worst, at = 0.0, None
    try:
        for n in lengths:
            q, k, v = _inputs(n, target, seed=n)
            err = relative_error(call(q, k.clone(), v), reference(q, k, v))
            if at is None or err > worst:
                worst, at = err, n
        ms, peak = _timed(call, target, timed_tokens)
    except Exception as exc:  # noqa: BLE001 - whatever a kernel raises makes it a failed candidate, not a crash
        if isinstance(exc, torch.cuda.OutOfMemoryError):
            torch.cuda.empty_cache()
        text = " ".join(f"{type(exc).__name__}: {exc}".split())
        return ProbeRow(kernel, "failed", note=text[:300])
    finally:
        if target.kind == "cuda":
            torch.cuda.empty_cache()
    ok = worst <= tolerance
    note = "" if ok else f"relative error {worst:.3g} at {at} tokens exceeds the tolerance {tolerance:g}"
    return ProbeRow(kernel, "accepted" if ok else "rejected", ms, timed_tokens, peak, worst, note)


def choose(rows: list[ProbeRow]) -> list[ProbeRow]:
    """The fastest accepted kernel becomes `chosen` (MATH only when it is the one accepted)."""
    accepted = [r for r in rows if r.verdict == "accepted"]
    fast = [r for r in accepted if r.kernel != "math"]
    pick = min(fast or accepted, key=lambda r: r.ms if r.ms is not None else math.inf, default=None)
    out = []
    for r in rows:
        if r is pick:
            r = dataclasses.replace(r, verdict="chosen")
        elif r.kernel == "math" and r.verdict == "accepted":
            r = dataclasses.replace(r, verdict="not needed", note="MATH runs only where no other kernel is accepted")
        out.append(r)
    return out


# -- deciding -----------------------------------------------------------------------------------


def decide(
    choice: str,
    target: Target,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS,
    cache: Path | None = None,
    kernels: Mapping[str, Kernel] | None = None,
    calls: Mapping[str, Call] | None = None,
    given: Mapping[str, ProbeRow] | None = None,
    progress: Progress | None = None,
) -> Decision:
    """The plan for `choice` on `target`, with the table that justifies it; raises AttentionError.

    `kernels` and `calls` replace the real kernels and their calls (stand-ins for tests). `given`:
    rows measured already (by a child that died later), not measured again. `progress` hears of
    each kernel before and after it is measured (the child reports to its parent through it)."""
    kernels = dict(kernels or KERNELS)
    if choice not in ("auto", *kernels):
        raise AttentionError(f"attention must be one of {', '.join(CHOICES)}, not {choice!r}")
    key = cache_key(choice, target, tolerance, math_max_tokens, kernels)
    hit = _read_cache(cache, key)
    if hit is not None and (kernels[hit.plan.kernel].unsupported(target) is None):
        return hit

    def plan(kernel: str) -> AttentionPlan:
        if kernels[kernel] is KERNELS.get(kernel):
            return plan_for(kernel, target, choice=choice, math_max_tokens=math_max_tokens)
        return AttentionPlan(kernel, choice, target.device, math_max_tokens)  # a stand-in kernel

    def probe(kernel: str) -> ProbeRow:
        if given and kernel in given:
            return given[kernel]
        why = kernels[kernel].unsupported(target)
        if why:
            return ProbeRow(kernel, "unsupported", note=why)
        if kernel == "math" and math_max_tokens < 1:
            return ProbeRow(kernel, "unsupported", note="MATH is switched off (its token limit is 0)")
        call = (calls or {}).get(kernel) or plan(kernel).attend
        lengths, n = ERROR_LENGTHS, TIMED_TOKENS[target.kind]
        if kernel == "math":  # quadratic and bounded: measured at what its bound allows, never at a job's length
            lengths = tuple(sorted({min(x, math_max_tokens) for x in ERROR_LENGTHS}, reverse=True))
            n = min(n, lengths[0])
        log.debug("attention probe: %s on %s", kernel, target.device)
        if progress:
            progress(kernel, None)
        row = measure(kernel, call, target, tolerance=tolerance, timed_tokens=n, lengths=lengths)
        if progress:
            progress(kernel, row)
        return row

    if choice != "auto":
        row = probe(choice)
        if row.verdict != "accepted":
            raise AttentionError(f"attention '{choice}' cannot run here: {row.note or row.verdict}")
        rows = [dataclasses.replace(row, verdict="chosen")]
    else:
        rows = [probe(name) for name in kernels if name != "math"]
        if not any(r.verdict == "accepted" for r in rows) and "math" in kernels:
            rows.append(probe("math"))
        elif "math" in kernels:
            rows.append(ProbeRow("math", "not needed", note="MATH runs only where no other kernel is accepted"))
        rows = choose(rows)
        if not any(r.verdict == "chosen" for r in rows):
            detail = "; ".join(f"{r.kernel}: {r.verdict}" + (f" ({r.note})" if r.note else "") for r in rows)
            raise AttentionError(f"attention 'auto': no kernel runs within tolerance on {target.device}: {detail}")
    rows = [unverified(r) for r in rows]
    chosen = next(r.kernel for r in rows if r.verdict == "chosen")
    if chosen in UNVERIFIED:
        log.warning("attention: %s runs: %s", chosen, UNVERIFIED_NOTE)
    decision = Decision(plan(chosen), tuple(rows), tolerance)
    _write_cache(cache, key, decision)
    return decision


def unverified(row: ProbeRow) -> ProbeRow:
    """The row, its note saying so where its kernel has never run on a GPU in h3core's check."""
    if row.kernel not in UNVERIFIED or UNVERIFIED_NOTE in row.note or row.verdict == "unsupported":
        return row
    return dataclasses.replace(row, note=f"{row.note}; {UNVERIFIED_NOTE}" if row.note else UNVERIFIED_NOTE)


# -- the cache ----------------------------------------------------------------------------------


def versions() -> dict[str, str]:
    """The libraries a decision depends on (a new one measures again)."""
    import torch

    out = {"torch": torch.__version__, "cuda": str(torch.version.cuda), "probe": str(PROBE_VERSION)}
    if torch.cuda.is_available():
        out["cudnn"] = str(torch.backends.cudnn.version())
    for dist in ("triton", "sageattention", "diffusers"):
        try:
            out[dist] = importlib.metadata.version(dist)
        except importlib.metadata.PackageNotFoundError:
            out[dist] = "-"
    return out


def cache_key(choice: str, target: Target, tolerance: float, math_max_tokens: int, kernels: Mapping[str, Kernel]) -> str:
    """The cache entry's key: a hash of everything the decision depends on, the library versions included."""
    data = {
        "choice": choice,
        "target": dataclasses.asdict(target),
        "tolerance": tolerance,
        "math_max_tokens": math_max_tokens,
        "kernels": sorted(kernels),
        "versions": versions(),
    }
    return hashlib.sha256(json.dumps(data, sort_keys=True, default=str).encode()).hexdigest()[:32]


def _read_cache(path: Path | None, key: str) -> Decision | None:
    if path is None or not path.exists():
        return None
    try:
        entry = json.loads(path.read_text()).get(key)
        return Decision.from_json(entry, cached=True) if entry else None
    except (OSError, ValueError, KeyError, TypeError) as exc:  # a damaged cache is measured again, not trusted
        log.warning("attention cache %s unreadable (%s): measuring again", path, exc)
        return None


def _write_cache(path: Path | None, key: str, decision: Decision) -> None:
    if path is None:
        return
    try:
        entries = json.loads(path.read_text()) if path.exists() else {}
    except (OSError, ValueError):
        entries = {}
    entries[key] = decision.to_json()
    tmp = path.with_name(f".{path.name}.{os.getpid()}")
    try:
        tmp.write_text(json.dumps(entries, indent=1) + "\n")
        os.replace(tmp, path)
    except OSError as exc:  # the cache saves time; not having it is no failure
        log.warning("attention cache %s not written: %s", path, exc)


# -- reporting ----------------------------------------------------------------------------------


def table(decision: Decision) -> list[str]:
    """The probe's table as Markdown lines (the log, the CLI and the GPU check print it)."""
    lines = [
        f"attention: {decision.plan.describe()} on {decision.plan.device}"
        + (" (cached decision)" if decision.cached else "")
        + f"; tolerance {decision.tolerance:g} relative L1 at {'/'.join(map(str, decision.lengths))} tokens",
        "| kernel | verdict | ms | at tokens | peak MiB | error | note |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in decision.rows:
        ms = f"{r.ms:.2f}" if r.ms is not None else "-"
        peak = f"{r.peak_bytes / 2**20:,.1f}" if r.peak_bytes is not None else "-"
        err = f"{r.error:.2e}" if r.error is not None else "-"
        lines.append(f"| {r.kernel} | {r.verdict} | {ms} | {r.tokens or '-'} | {peak} | {err} | {r.note} |")
    return lines


def at_start(
    model_dir: Path,
    device: str,
    dtype: str,
    choice: str,
    *,
    tolerance: float = DEFAULT_TOLERANCE,
    math_max_tokens: int = DEFAULT_MATH_MAX_TOKENS,
    cache: Path | None = None,
    in_child: bool = False,
) -> Decision:
    """An executor's decision at start, at its model's geometry, logged; raises AttentionError.

    `in_child`: measure in a fresh interpreter (an executor whose devices belong to its workers)."""
    from h3core.executors.pipeline.model import ModelError, attention_geometry

    try:
        heads, head_dim = attention_geometry(model_dir)
    except ModelError as exc:
        raise AttentionError(str(exc)) from exc
    if in_child:
        target_args = {"device": device, "dtype": dtype, "heads": heads, "head_dim": head_dim}
        decision = decide_in_child(choice, target_args, tolerance=tolerance, math_max_tokens=math_max_tokens, cache=cache)
    else:
        target = Target.detect(device, dtype, heads, head_dim)
        decision = decide(choice, target, tolerance=tolerance, math_max_tokens=math_max_tokens, cache=cache)
    for line in table(decision):
        log.info("%s", line)
    return decision


def decide_in_child(choice: str, target_args: dict, **kw) -> Decision:
    """`decide` in a fresh interpreter, so that the calling process never creates a CUDA context,
    and a kernel that kills the process or poisons its device is a failed row, not a failed start.

    The child reports each kernel before and after measuring it (one JSON line each); when it dies
    between the two, that kernel is recorded as failed with how the process ended, and a new child
    goes on from the rows measured so far (at most one restart per kernel)."""
    entry = "import sys; from h3core.executors.pipeline.kernel_probe import main; sys.exit(main())"
    base = [sys.executable, "-c", entry, "--json", "--progress", "--choice", choice]
    for name, value in {**target_args, **kw}.items():
        if value is not None:
            base += [f"--{name.replace('_', '-')}", str(value)]
    given: dict[str, ProbeRow] = {}
    for _ in range(len(KERNELS) + 1):
        cmd = base + (["--given", json.dumps({k: dataclasses.asdict(r) for k, r in given.items()})] if given else [])
        proc = subprocess.run(cmd, capture_output=True, text=True)
        probing: str | None = None
        for line in proc.stdout.splitlines():
            try:
                message = json.loads(line)
            except ValueError:
                continue  # a library's own print; the protocol is the JSON lines
            if not isinstance(message, dict):
                continue
            if "probing" in message:
                probing = message["probing"]
            elif "row" in message:
                row = ProbeRow(**message["row"])
                given[row.kernel] = row
                probing = None
            elif "plan" in message and proc.returncode == 0:
                return Decision.from_json(message, cached=message.get("cached", False))
        lines = [ln for ln in proc.stderr.strip().splitlines() if ln.strip()]
        if proc.returncode == 2 and lines and lines[-1].startswith("AttentionError: "):
            raise AttentionError(lines[-1].removeprefix("AttentionError: "))
        ended = _how_it_ended(proc.returncode)
        if probing is None:
            if proc.returncode == POISONED and given:
                continue  # the device was unusable after the last row: a fresh process goes on
            tail = " | ".join(lines[-3:])[-400:]
            raise AttentionError(f"the attention probe {ended} before it decided" + (f": {tail}" if tail else ""))
        tail = " | ".join(lines[-2:])[-200:]
        note = f"the probe's process {ended} while running it" + (f": {tail}" if tail else "")
        log.warning("attention probe: %s: %s; probing the other kernels in a new process", probing, note)
        given[probing] = ProbeRow(probing, "failed", note=note[:300])
    raise AttentionError(f"the attention probe died {len(KERNELS) + 1} times: {', '.join(given)}")


POISONED = 3  # the child's exit code when the device is unusable after a kernel failed


def _how_it_ended(returncode: int) -> str:
    if returncode < 0:
        try:
            return f"was killed by {signal.Signals(-returncode).name}"
        except ValueError:
            return f"was killed by signal {-returncode}"
    return f"exited {returncode}"


def _device_usable(target: Target) -> bool:
    """After a kernel failed on CUDA: can this process still run anything on the device?"""
    import torch

    try:
        torch.cuda.synchronize(target.device)
        return float(torch.ones(1, device=target.device).add_(1).item()) == 2.0
    except Exception:  # noqa: BLE001 - a sticky CUDA error raises here, whatever its type
        return False


def _stand_ins(spec: str | None) -> tuple[Mapping[str, Kernel] | None, Mapping[str, Call] | None]:
    """Tests only: `module:function` returning (kernels, calls), the stand-ins `decide` takes."""
    if not spec:
        return None, None
    import importlib

    module, _, name = spec.partition(":")
    kernels, calls = getattr(importlib.import_module(module), name)()
    return kernels, calls


def main(argv: list[str] | None = None) -> int:
    """The probe's command line, and the entry of `decide_in_child`'s child: print the decision (a table,
    or JSON lines with `--json` and `--progress`) and return 0, or 2 after an `AttentionError`, its
    message the last line on stderr; exits 3 (`POISONED`) where the device is unusable after a kernel."""
    p = argparse.ArgumentParser(description="Probe the attention kernels at a model's geometry and print the decision.")
    p.add_argument("--choice", default="auto", choices=CHOICES)
    p.add_argument("--device", default="cpu")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--heads", type=int, default=56)
    p.add_argument("--head-dim", type=int, default=128)
    p.add_argument("--tolerance", type=float, default=DEFAULT_TOLERANCE)
    p.add_argument("--math-max-tokens", type=int, default=DEFAULT_MATH_MAX_TOKENS)
    p.add_argument("--cache", type=Path)
    p.add_argument("--json", action="store_true", help="one JSON line (the decision) instead of the table")
    p.add_argument("--progress", action="store_true", help="a JSON line before and after each kernel (for the parent)")
    p.add_argument("--given", help="JSON: rows measured already, by kernel")
    p.add_argument("--stand-ins", default=os.environ.get(STAND_INS_ENV), help=argparse.SUPPRESS)
    a = p.parse_args(argv)
    given = {k: ProbeRow(**r) for k, r in json.loads(a.given).items()} if a.given else None

    def report(kernel: str, row: ProbeRow | None) -> None:
        print(json.dumps({"probing": kernel} if row is None else {"row": dataclasses.asdict(row)}), flush=True)
        if row is not None and row.verdict == "failed" and target.kind == "cuda" and not _device_usable(target):
            print(f"the device is unusable after {kernel} failed: a new process goes on", file=sys.stderr, flush=True)
            os._exit(POISONED)  # no cleanup: the context is what is broken

    try:
        target = Target.detect(a.device, a.dtype, a.heads, a.head_dim)
        kernels, calls = _stand_ins(a.stand_ins)
        d = decide(
            a.choice,
            target,
            tolerance=a.tolerance,
            math_max_tokens=a.math_max_tokens,
            cache=a.cache,
            kernels=kernels,
            calls=calls,
            given=given,
            progress=report if a.progress else None,
        )
    except AttentionError as exc:
        print(f"AttentionError: {exc}", file=sys.stderr)
        return 2
    print(json.dumps({**d.to_json(), "cached": d.cached}) if a.json else "\n".join(table(d)))
    return 0
