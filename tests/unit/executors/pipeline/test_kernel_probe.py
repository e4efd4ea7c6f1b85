"""The start-up probe: what it accepts and rejects (a stand-in kernel with SageAttention 1.0.6's
padding bug planted in it must be rejected), which accepted kernel wins, and the cache."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from h3core.executors.pipeline import kernel_probe  # noqa: E402
from h3core.executors.pipeline.attention import ANY_FLOAT, KERNELS, AttentionError, Kernel, Rule, Target  # noqa: E402
from h3core.executors.pipeline.kernel_probe import Decision, choose, decide, measure  # noqa: E402
from h3core.executors.reports import ProbeRow  # noqa: E402

TINY = Target("cpu", "float32", 2, 32)


def exact(q, k, v):
    """Attention as it should be, in diffusers' (batch, sequence, heads, dim) layout."""
    return F.scaled_dot_product_attention(*(t.transpose(1, 2) for t in (q, k, v))).transpose(1, 2)


def padded(q, k, v):
    """SageAttention 1.0.6's bug: keys and values padded to a multiple of 64 and the padding left unmasked."""
    pad = -k.shape[1] % 64
    k, v = (torch.cat([t, t.new_zeros(t.shape[0], pad, *t.shape[2:])], dim=1) for t in (k, v))
    return exact(q, k, v)


def test_the_planted_padding_bug_is_rejected_at_the_unaligned_length_and_exact_attention_accepted():
    ok = measure("flash", exact, TINY, tolerance=0.05, timed_tokens=256)
    assert ok.verdict == "accepted" and ok.error < 1e-5 and ok.ms > 0 and ok.tokens == 256
    bad = measure("sage-triton", padded, TINY, tolerance=0.05, timed_tokens=256)
    assert bad.verdict == "rejected" and bad.error > 0.1
    assert "at 135 tokens exceeds the tolerance 0.05" in bad.note and bad.ms is not None  # still timed, for the table
    # Aligned lengths alone would not have caught it:
    aligned = measure("sage-triton", padded, TINY, tolerance=0.05, timed_tokens=256, lengths=(1024, 128))
    assert aligned.verdict == "accepted"


def test_a_kernel_that_raises_or_returns_nan_is_not_accepted():
    def raises(q, k, v):
        raise AssertionError("head dim must be 64, 96 or 128")

    failed = measure("sage-triton", raises, TINY, tolerance=0.05, timed_tokens=64)
    assert failed.verdict == "failed" and failed.note == "AssertionError: head dim must be 64, 96 or 128"
    nan = measure("flash", lambda q, k, v: exact(q, k, v) * float("nan"), TINY, tolerance=0.05, timed_tokens=64)
    assert nan.verdict == "rejected" and "relative error inf" in nan.note


def row(kernel, verdict="accepted", ms=1.0):
    return ProbeRow(kernel, verdict, ms=ms, error=0.0 if verdict == "accepted" else 0.2)


def test_the_fastest_accepted_kernel_wins_and_a_faster_rejected_one_never_does():
    rows = choose(
        [row("cudnn", ms=50.5), row("flash", ms=87.1), row("sage-triton", "rejected", ms=10.0), row("efficient", ms=170)]
    )
    assert [r.verdict for r in rows] == ["chosen", "accepted", "rejected", "accepted"]


def test_math_wins_only_when_nothing_else_is_accepted():
    rows = choose([row("flash", ms=9.0), row("math", ms=1.0)])
    assert [r.verdict for r in rows] == ["chosen", "not needed"]
    rows = choose([row("flash", "failed", ms=None), row("math", ms=100.0)])
    assert [r.verdict for r in rows] == ["failed", "chosen"]
    assert not any(r.verdict == "chosen" for r in choose([row("flash", "rejected"), row("math", "failed", None)]))


CPU_ANY = (Rule("cpu", ANY_FLOAT),)
STANDINS = {"flash": KERNELS["flash"], "sage-triton": Kernel("sage-triton", CPU_ANY, backend="stand-in"), "math": KERNELS["math"]}


def counted(fn, calls: list, name: str):
    def call(q, k, v):
        calls.append(name)
        return fn(q, k, v)

    return call


def test_auto_rejects_the_buggy_kernel_and_runs_flash():
    calls = []
    d = decide("auto", TINY, kernels=STANDINS, calls={"sage-triton": counted(padded, calls, "sage")})
    assert d.plan.kernel == "flash" and d.plan.choice == "auto" and not d.cached
    verdicts = {r.kernel: r.verdict for r in d.rows}
    assert verdicts == {"flash": "chosen", "sage-triton": "rejected", "math": "not needed"} and calls


def test_a_forced_kernel_must_run_and_be_right_or_the_start_is_refused():
    with pytest.raises(AttentionError, match=r"attention 'sage-triton' cannot run here: relative error .* at 135 tokens"):
        decide("sage-triton", TINY, kernels=STANDINS, calls={"sage-triton": padded})
    with pytest.raises(AttentionError, match="attention 'efficient' cannot run here: efficient needs a CUDA device, not cpu"):
        decide("efficient", TINY)
    with pytest.raises(AttentionError, match="must be one of auto, cudnn"):
        decide("native", TINY)
    forced = decide("sage-triton", TINY, kernels=STANDINS, calls={"sage-triton": exact})
    assert [(r.kernel, r.verdict) for r in forced.rows] == [("sage-triton", "chosen")]


def test_math_is_the_fallback_with_its_bound_and_can_be_switched_off():
    broken = {"flash": Kernel("flash", CPU_ANY, sdpa="FLASH_ATTENTION"), "math": KERNELS["math"]}
    d = decide("auto", TINY, kernels=broken, calls={"flash": padded}, math_max_tokens=512)
    assert d.plan.kernel == "math" and d.plan.max_tokens == 512
    assert {r.kernel: r.verdict for r in d.rows} == {"flash": "rejected", "math": "chosen"}
    assert next(r for r in d.rows if r.kernel == "math").tokens == 512  # measured within its bound
    with pytest.raises(AttentionError, match="no kernel runs within tolerance on cpu: flash: rejected .*math: unsupported"):
        decide("auto", TINY, kernels=broken, calls={"flash": padded}, math_max_tokens=0)


def test_the_real_auto_on_a_cpu_chooses_flash_at_the_models_geometry():
    d = decide("auto", TINY)
    assert d.plan.kernel == "flash" and d.rows[[r.kernel for r in d.rows].index("flash")].error < 1e-5
    assert {r.verdict for r in d.rows if r.kernel not in ("flash", "math")} == {"unsupported"}


def test_the_decision_is_cached_by_what_it_depends_on(tmp_path, monkeypatch):
    cache = tmp_path / "attention.json"
    calls = []
    kw = dict(kernels=STANDINS, calls={"sage-triton": counted(exact, calls, "sage")}, cache=cache)
    first = decide("auto", TINY, **kw)
    probed = len(calls)
    again = decide("auto", TINY, **kw)
    assert again.cached and len(calls) == probed and again.rows == first.rows and again.plan == first.plan
    decide("auto", dataclasses.replace(TINY, heads=4), **kw)  # another geometry: measured
    assert len(calls) > probed
    n = len(calls)
    decide("auto", TINY, tolerance=0.01, **kw)  # another tolerance: measured
    assert len(calls) > n
    n = len(calls)
    monkeypatch.setattr(kernel_probe, "versions", lambda: {"torch": "9.9"})  # a library upgrade: measured
    decide("auto", TINY, **kw)
    assert len(calls) > n and len(json.loads(cache.read_text())) == 4


def test_a_damaged_cache_is_measured_again_not_trusted(tmp_path):
    cache = tmp_path / "attention.json"
    cache.write_text("{not json")
    d = decide("auto", TINY, cache=cache)
    assert not d.cached and d.plan.kernel == "flash"
    assert decide("auto", TINY, cache=cache).cached  # and rewritten


@pytest.mark.slow  # a child interpreter that imports torch
def test_a_decision_survives_json_and_the_child_process(tmp_path, capsys):
    d = decide("auto", TINY)
    assert Decision.from_json(json.loads(json.dumps(d.to_json()))) == d
    child = kernel_probe.decide_in_child("auto", {"device": "cpu", "dtype": "float32", "heads": 2, "head_dim": 32})
    assert child.plan == d.plan and [r.kernel for r in child.rows] == [r.kernel for r in d.rows]
    # What the child says when it refuses (decide_in_child raises its last line):
    assert kernel_probe.main(["--choice", "efficient", "--heads", "2", "--head-dim", "32"]) == 2
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        "AttentionError: attention 'efficient' cannot run here: efficient needs a CUDA device, not cpu"
    )


def test_the_table_names_every_kernel_and_the_decision():
    lines = kernel_probe.table(decide("auto", TINY))
    assert lines[0].startswith("attention: flash (asked auto) on cpu; tolerance 0.05 relative L1 at 1024/135 tokens")
    assert len(lines) == 3 + len(KERNELS) and any(ln.startswith("| flash | chosen |") for ln in lines)


def test_at_start_reads_the_models_geometry_and_logs_the_table(tmp_path, caplog):
    (tmp_path / "transformer").mkdir()
    (tmp_path / "transformer" / "config.json").write_text(json.dumps({"num_attention_heads": 2, "attention_head_dim": 32}))
    with caplog.at_level("INFO", logger="h3core.attention"):
        d = kernel_probe.at_start(tmp_path, "cpu", "float32", "auto")
    assert d.plan.kernel == "flash"
    logged = [r.getMessage() for r in caplog.records if r.name == "h3core.attention"]
    assert logged[0].startswith("attention: flash (asked auto) on cpu") and any("| flash | chosen |" in m for m in logged)
    with pytest.raises(AttentionError, match="cannot read the attention geometry"):
        kernel_probe.at_start(tmp_path / "nothing", "cpu", "float32", "auto")


def test_given_rows_are_not_measured_again_and_the_sage_2_kernels_are_marked_unverified():
    calls = []
    given = {"sage-triton": ProbeRow("sage-triton", "failed", note="the probe's process was killed by SIGSEGV while running it")}
    kernels = {**STANDINS, "sage-fp16": Kernel("sage-fp16", CPU_ANY, backend="stand-in")}
    heard = []
    d = decide(
        "auto",
        TINY,
        kernels=kernels,
        calls={"sage-triton": counted(exact, calls, "sage"), "sage-fp16": padded},
        given=given,
        progress=lambda kernel, row: heard.append((kernel, row.verdict if row else None)),
    )
    rows = {r.kernel: r for r in d.rows}
    assert not calls and rows["sage-triton"] == given["sage-triton"] and d.plan.kernel == "flash"
    assert heard == [("flash", None), ("flash", "accepted"), ("sage-fp16", None), ("sage-fp16", "rejected")]
    assert rows["sage-fp16"].note.endswith("; " + kernel_probe.UNVERIFIED_NOTE)
    assert kernel_probe.UNVERIFIED_NOTE not in rows["flash"].note + rows["sage-triton"].note
    # Unsupported here: not offered, so not marked.
    assert kernel_probe.UNVERIFIED_NOTE not in next(r for r in decide("auto", TINY).rows if r.kernel == "sage-fp8").note


@pytest.mark.slow  # child interpreters that import torch
def test_a_kernel_that_kills_or_breaks_the_probes_process_is_failed_with_its_error_and_auto_goes_on(monkeypatch):
    from tests.fakes import kernels as faulting

    monkeypatch.setenv(kernel_probe.STAND_INS_ENV, faulting.SPEC)
    d = kernel_probe.decide_in_child("auto", {"device": "cpu", "dtype": "float32", "heads": 2, "head_dim": 32})
    rows = {r.kernel: r for r in d.rows}
    assert d.plan.kernel == "flash" and rows["flash"].verdict == "chosen"
    assert rows["sage-fp16"].verdict == "failed" and rows["sage-fp16"].note.startswith(
        "the probe's process was killed by SIGSEGV while running it"
    )
    assert rows["sage-fp8"].verdict == "failed" and rows["sage-fp8"].note.startswith(
        "RuntimeError: CUDA error: an illegal memory access was encountered"
    )
    assert rows["sage-triton"].verdict == "failed" and rows["sage-triton"].note.startswith(
        "the probe's process exited 70 while running it"
    )
    assert all(rows[k].note.endswith(kernel_probe.UNVERIFIED_NOTE) for k in ("sage-fp16", "sage-fp8"))
    table = "\n".join(kernel_probe.table(d))
    assert "| sage-fp16 | failed |" in table and "killed by SIGSEGV" in table
    # Forced, the faulting kernel refuses the start with how its process ended.
    with pytest.raises(AttentionError, match="attention 'sage-triton' cannot run here: the probe's process exited 70"):
        kernel_probe.decide_in_child("sage-triton", {"device": "cpu", "dtype": "float32", "heads": 2, "head_dim": 32})


@pytest.mark.slow  # a child interpreter
def test_a_child_that_dies_before_measuring_anything_says_how(monkeypatch):
    monkeypatch.setenv(kernel_probe.STAND_INS_ENV, "tests.fakes.no_such_module:faulting")
    with pytest.raises(AttentionError, match="the attention probe exited 1 before it decided: .*ModuleNotFoundError"):
        kernel_probe.decide_in_child("auto", {"device": "cpu", "dtype": "float32", "heads": 2, "head_dim": 32})
