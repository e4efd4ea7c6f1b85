from __future__ import annotations

import re

import pytest
from typer.testing import CliRunner

from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.cli import app
from h3core.domain.events import Admitted, Done, Failed, Running
from tests.factories import artifact, submitted

cli = CliRunner()


def _t2va_rows(output):
    return dict(
        (m.group(1), (int(m.group(2)), m.group(3)))
        for m in re.finditer(r"(\d+x\d+)\s+│ t2va\s+│\s+(\d+) │\s+[\d.]+ │ (\w+)", output)
    )


def test_show_prints_a_profiles_ceilings_with_reasons(tmp_path):
    args = ["capacity", "show", "--db", str(tmp_path / "h3.db"), "--executor", "fake", "--profile", "4x2080ti-sage-fp16"]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    assert _t2va_rows(result.output) == {
        "832x480": (1127, "vram"),
        "1024x576": (753, "vram"),
        "1344x768": (430, "vram"),
        "448x256": (1200, "quality"),
    }
    assert "133,236" in result.output and "134,546" in result.output


def test_show_prints_the_executors_effective_ceilings_not_the_profiles_alone(tmp_path, monkeypatch):
    """The default server (the pipeline on the tiny model, on a CPU): no profile describes it, so
    the only ceiling is the longest video made as segments past the model's window."""
    monkeypatch.chdir(tmp_path)
    result = cli.invoke(app, ["capacity", "show", "--db", str(tmp_path / "h3.db")])
    assert result.exit_code == 0, result.output
    assert "none describes this executor" in result.output and "0-15 s (model facts of minimax-h3-tiny)" in result.output
    assert set(_t2va_rows(result.output).values()) == {(1440, "api_limit")}


def test_show_reads_what_the_running_executor_published(tmp_path):
    from h3core.domain.capabilities import Capabilities, ModeReadiness
    from h3core.runtime.admission import CapabilityFile, capabilities_path

    db = tmp_path / "h3.db"
    CapabilityFile(capabilities_path(db)).publish(
        Capabilities(executor="comfyui", topology="raylight", model="minimax-h3", modes=(ModeReadiness(mode="t2va"),))
    )
    result = cli.invoke(app, ["capacity", "show", "--db", str(db)])
    assert result.exit_code == 0, result.output
    assert f"as the runner on {db} states it" in result.output and "4x2080ti-sage-fp16" in result.output
    assert _t2va_rows(result.output)["832x480"] == (1127, "vram")
    assert "fl2va NOT SERVED" in result.output


def test_show_names_a_bad_profile_and_its_field(tmp_path):
    bad = tmp_path / "p.toml"
    bad.write_text('name = "x"\n')
    result = cli.invoke(app, ["capacity", "show", "--executor", "fake", "--db", str(tmp_path / "h3.db"), "--profile", str(bad)])
    assert result.exit_code == 2 and "hardware" in result.output


DEPLOYMENT = {
    "hardware": "ComfyUI at http://127.0.0.1:8188",
    "topology": "raylight",
    "model_name": "minimax-h3",
    "group_sizes": "1",
}
TINY_CPU = {"hardware": "cpu", "model_name": "minimax-h3-tiny", "group_sizes": "1"}


def _job(store, job_id, tokens, outcome, executor="comfyui", info=DEPLOYMENT, **req):
    store.append(job_id, [submitted(**req), Admitted(tokens=tokens), Running(attempt=1, executor=executor, info=info)])
    if outcome == "ran":
        store.append(job_id, [Done(artifact=artifact(), tokens=tokens)])
    else:
        store.append(job_id, [Failed(kind="oom", message="CUDA out of memory", tokens=tokens)])


def _fit(db, *args):
    result = cli.invoke(app, ["capacity", "fit", "--db", str(db), "--profile", "4x2080ti-sage-fp16", *args])
    assert result.exit_code == 0, result.output
    return result.output


def test_fit_proposes_a_budget_from_the_profiles_points_and_the_jobs_that_ran_on_its_hardware(tmp_path):
    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    _job(store, "small", 90_000, "ran", width=1344, height=768, frames=300)
    _job(store, "big", 133_900, "ran", width=832, height=480, frames=1130)
    _job(store, "toobig", 134_200, "oom", width=1024, height=576, frames=780)
    store.close()
    out = _fit(db)
    assert "6 ran, 4 out of memory" in out  # the profile's 4 runs and 3 OOMs, and the jobs' 2 and 1
    assert "job big (t2va 832x480x1130): 133,900 tokens" in out
    assert "job toobig (t2va 1024x576x780): 134,200 tokens" in out
    assert "proposed budget: 133,900 tokens (profile now: 133,236; +664)" in out
    assert 'width = 832, height = 480, frames = 1130, outcome = "ran"' in out


def test_fit_ignores_jobs_that_ran_elsewhere_and_never_goes_below_a_measured_run(tmp_path):
    """One tiny-model CPU job must not propose cutting the 2080 Ti budget to its 110 tokens."""
    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    _job(store, "tiny", 110, "ran", executor="pipeline", info=TINY_CPU, width=32, height=32, frames=5)
    _job(store, "old", 110, "ran", executor="pipeline", info={})  # recorded before runs said where they ran
    store.close()
    out = _fit(db)
    assert "2 finished job(s) ran where this profile does not describe" in out
    assert "no job in the store ran where this profile describes" in out and "proposed budget" not in out
    store = SQLiteEventStore(db)
    _job(store, "low", 120_000, "oom")  # an OOM below measured runs is a contradiction, not a new bound
    store.close()
    out = _fit(db)
    assert "CONTRADICTION" in out and "job low" in out
    assert "proposed budget: 133,236 tokens (profile now: 133,236; +0)" in out


def test_fit_checks_each_built_in_profile_against_its_own_jobs(tmp_path):
    db = tmp_path / "h3.db"
    store = SQLiteEventStore(db)
    h200 = {"hardware": "NVIDIA H200", "model_name": "minimax-h3", "group_sizes": "1", "kernel": "cudnn"}
    _job(store, "h", 90_000, "ran", executor="pipeline", info=h200)
    store.close()
    result = cli.invoke(app, ["capacity", "fit", "--db", str(db)])
    assert result.exit_code == 0, result.output
    h200_part = result.output.split("profile 1xh200-bf16")[1].split("profile 4x2080ti")[0]
    assert "proposed budget: 90,000 tokens (profile now: 73,386; +16,614)" in h200_part
    assert "no job in the store ran where this profile describes" in result.output.split("profile 4x2080ti")[1]


@pytest.mark.slow  # a probe process that imports torch and runs the model
def test_probe_finds_a_real_out_of_memory_boundary_under_a_memory_cap(tmp_path):
    """The tiny geometry on this CPU under a 1.5 GiB cap on the measuring process's address space
    (RLIMIT_AS), with the MATH kernel named (`--attention math`, bounded far above): SDPA's quadratic MATH
    kernel (allowed here up to a million tokens). 22 frames at 256x256 fit; at 600 the attention
    matrix alone needs 1.4 GB and torch's own allocation fails in the denoising step."""
    pytest.importorskip("diffusers")
    from h3core.adapters.profiles import load_profile
    from h3core.executors.pipeline.tiny import FACTS

    out = tmp_path / "probed.toml"
    args = [
        "capacity",
        "probe",
        "--geometry",
        "tiny",
        "--device",
        "cpu",
        "--dtype",
        "float32",
        "--attention",
        "math",
        "--math-max-tokens",
        "1000000",
        "--resolution",
        "256x256",
        "--start-frames",
        "22",
        "--max-frames",
        "600",
        "--growth",
        "30",
        "--precision",
        "1200",
        "--text-tokens",
        "16",
        "--memory-cap",
        "1.5",
        "-o",
        str(out),
    ]
    result = cli.invoke(app, args)
    assert result.exit_code == 0, result.output
    profile = load_profile(out)
    assert profile.source == "probed with random weights"
    assert [(p.frames, p.outcome) for p in profile.points] == [(22, "ran"), (600, "oom")]
    assert "step " in profile.points[0].note and "decode " in profile.points[0].note
    assert "out of memory in denoise" in profile.points[1].note and "can't allocate memory" in profile.points[1].note
    b = profile.budget()
    assert b.verified and b.largest_ran.frames == 22 and b.smallest_oom.frames == 600
    assert b.largest_ran_tokens <= b.tokens < b.smallest_oom_tokens
    (match,) = profile.match
    assert (match.executor, match.device, match.kernel, match.model, match.group_size) == (
        "pipeline",
        "cpu",
        "math",
        FACTS["name"],
        1,
    )
    assert "256x256x600   oom" in result.output and f"budget: {b.tokens:,} tokens" in result.output


@pytest.mark.parametrize(
    ("extra", "says"),
    [
        (["--resolution", "100x64"], "--resolution 100x64"),
        (["--resolution", "wide"], "WIDTHxHEIGHT"),
        (["--geometry", "huge"], "--geometry must be one of released, tiny"),
    ],
)
def test_probe_refuses_bad_input_naming_it(extra, says):
    result = cli.invoke(app, ["capacity", "probe", *extra])
    assert result.exit_code == 2 and says in result.output, result.output


def test_probe_that_nothing_fits_writes_no_profile_and_says_why(tmp_path, monkeypatch):
    """A device on which nothing runs (a fake measuring process: every point out of memory)."""
    from contextlib import contextmanager

    from h3core.domain.probe import Measurement, ProbeIdentity
    from h3core.executors.pipeline import probe

    class Nothing:
        identity = ProbeIdentity(device="cpu", dtype="float32", kernel="native", attention="native", model="m", geometry="tiny")
        resident_bytes, build_seconds = 1, 0.1

        def measure(self, width, height, frames):
            return Measurement(width=width, height=height, frames=frames, outcome="oom", stage="denoise", error="out of memory")

    monkeypatch.setattr(probe, "probe_process", contextmanager(lambda spec: iter([Nothing()])))
    out = tmp_path / "p.toml"
    result = cli.invoke(app, ["capacity", "probe", "--geometry", "tiny", "--resolution", "64x64", "-o", str(out)])
    assert result.exit_code == 1, result.output
    assert (
        "64x64x22    oom" in result.output
        and "the points give no profile" in result.output
        and "at least one run" in result.output
    )
    assert not out.exists()
