"""The GPU check's CPU side (bench/gpu_check.sh, bench/gpu/): which bundled wheels a machine's python
gets, the stop where the bundle was made for another python or torch is missing, and the full-size
step at toy geometry (its dry run)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from bench.gpu import wheels

ROOT = Path(__file__).resolve().parents[2]

CP312 = {"cp312-cp312-manylinux_2_17_x86_64", "cp312-abi3-manylinux_2_17_x86_64", "py3-none-any"}
CP313 = {"cp313-cp313-manylinux_2_17_x86_64", "cp312-abi3-manylinux_2_17_x86_64", "py3-none-any"}


def bundle(folder: Path, *names: str) -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    for name in names:
        (folder / name).write_bytes(b"")
    return folder


PAIR = ("pydantic-2.14.4-py3-none-any.whl", "pydantic_core-2.50.5-cp312-cp312-manylinux_2_17_x86_64.whl")


def decisions(folder, tags, have=None):
    return {w.name.split("-")[0]: (take, why) for w, take, why in wheels.select(folder, tags, have or {})}


def test_a_pair_whose_compiled_half_this_python_cannot_take_is_left_out_whole(tmp_path):
    folder = bundle(tmp_path / "b", *PAIR, "av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl", "tabulate-0.10.0-py3-none-any.whl")
    on312 = decisions(folder, CP312 | {"cp311-abi3-manylinux_2_28_x86_64"}, {"pydantic": "2.11.0"})
    assert on312["pydantic"] == (True, "core (the machine's 2.11.0 is shadowed)") and on312["pydantic_core"][0]
    # On 3.13 the cp312 core does not install; pydantic must not shadow the machine's working copy.
    on313 = decisions(folder, CP313 | {"cp311-abi3-manylinux_2_28_x86_64"}, {"pydantic": "2.11.0", "tabulate": "0.9"})
    assert on313["pydantic_core"] == (False, "no wheel for this python (cp312-cp312-manylinux_2_17_x86_64.whl)")
    assert on313["pydantic"][0] is False and "no pydantic-core wheel for this python" in on313["pydantic"][1]
    assert on313["av"] == (True, "core")  # abi3: any CPython from 3.11
    assert on313["tabulate"] == (True, "the machine has older 0.9")
    assert decisions(folder, CP313, {"tabulate": "0.10.0"})["tabulate"] == (False, "the machine has 0.10.0: kept")


def test_wheel_tags_are_matched_with_the_fallback_when_packaging_is_absent():
    me = {"python": "3.12", "tag": "cp312", "machine": "x86_64"}
    tags = wheels.fallback_tags(me, (2, 28))
    assert wheels.wheel_tags("pydantic_core-2.50.5-cp312-cp312-manylinux2014_x86_64.manylinux_2_17_x86_64.whl") & tags
    assert wheels.wheel_tags("av-18.1.0-cp311-abi3-manylinux_2_28_x86_64.whl") & tags
    assert not wheels.wheel_tags("pydantic_core-2.50.5-cp313-cp313-manylinux_2_17_x86_64.whl") & tags
    assert not wheels.wheel_tags("av-18.1.0-cp311-abi3-manylinux_2_34_x86_64.whl") & tags  # newer glibc than the machine's


def run(*args, env=None, **kw):
    return subprocess.run(args, capture_output=True, text=True, cwd=ROOT, env={**os.environ, **(env or {})}, **kw)


def test_the_check_names_both_pythons_and_stops_when_the_bundle_was_made_for_another(tmp_path):
    folder = bundle(tmp_path / "b", *PAIR)
    (folder / "manifest.json").write_text(json.dumps({"implementation": "cp", "pythons": ["3.9"], "machine": "x86_64"}))
    done = run(sys.executable, "bench/gpu/wheels.py", "check", str(folder))
    me = f"{sys.version_info[0]}.{sys.version_info[1]}"
    assert done.returncode == 3, done.stdout + done.stderr
    assert "was made for cp 3.9 (manylinux x86_64); this machine's python is cp " in done.stdout
    assert f"H3GPU_PYVER={me} bash bench/gpu_bundle.sh" in done.stdout
    (folder / "manifest.json").write_text(json.dumps({"implementation": "cp", "pythons": [me], "machine": "x86_64"}))
    assert run(sys.executable, "bench/gpu/wheels.py", "check", str(folder)).returncode == 0


def test_a_gpu_check_on_a_mismatched_bundle_stops_before_any_other_step(tmp_path):
    folder = bundle(tmp_path / "b", *PAIR)
    (folder / "manifest.json").write_text(json.dumps({"implementation": "cp", "pythons": ["3.9"], "machine": "x86_64"}))
    env = {"PYTHON": sys.executable, "H3GPU_WHEELS": str(folder), "OUT": str(tmp_path / "out"), "H3GPU_WORK": str(tmp_path / "w")}
    done = run("bash", "bench/gpu_check.sh", env={**env, "H3GPU_DRY": ""}, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "STOPPED after 0 interpreter" in done.stdout and "1 wheels" not in done.stdout


def test_env_without_torch_says_so_in_one_line_and_exits_1(tmp_path):
    (tmp_path / "torch").mkdir()
    (tmp_path / "torch" / "__init__.py").write_text("raise ImportError('libcudart.so.13: cannot open shared object file')\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "H3GPU_DRY": "", "OUT": str(tmp_path / "out")}
    done = run(sys.executable, "-m", "bench.gpu.env", env=env, timeout=120)
    assert done.returncode == 1 and "Traceback" not in done.stdout + done.stderr
    assert "STOP: torch does not import with" in done.stdout and "libcudart.so.13" in done.stdout


@pytest.mark.slow  # imports torch and diffusers; about a minute on a busy CPU
def test_env_without_cuda_stops_and_the_full_size_step_runs_at_toy_geometry(tmp_path):
    env = {"PYTHONPATH": str(ROOT), "OUT": str(tmp_path / "out"), "H3GPU_WORK": str(tmp_path / "w")}
    done = run(sys.executable, "-m", "bench.gpu.env", env={**env, "H3GPU_DRY": "", "CUDA_VISIBLE_DEVICES": ""}, timeout=300)
    assert done.returncode == 1 and "sees no CUDA device; no later step can run" in done.stdout, done.stdout[-1500:]
    done = run(sys.executable, "-m", "bench.gpu.fullsize", env={**env, "H3GPU_DRY": "cpu"}, timeout=300)
    assert done.returncode == 0, done.stdout[-1500:] + done.stderr[-3000:]
    out = done.stdout
    assert "| tokens | kernel | product step (median of steps 2+) | bare forward (median of 2) | product / bare | bar |" in out
    assert "mux: 22 frames 64x64 + audio (H.264 + AAC)" in out and "non-denoise share" in out


def wheel(folder: Path, name: str, version: str, *needs: str, tag: str = "py3-none-any") -> Path:
    """A wheel with just the METADATA that names its requirements."""
    import zipfile

    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{version}-{tag}.whl"
    meta = f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n" + "".join(f"Requires-Dist: {n}\n" for n in needs)
    with zipfile.ZipFile(path, "w") as z:
        z.writestr(f"{name}-{version}.dist-info/METADATA", meta)
    return path


def test_requirements_are_followed_through_the_bundle_and_refused_where_missing_or_too_old(tmp_path):
    a = wheel(tmp_path, "alpha", "1.0", "beta>=2", "gamma", "old-only; python_version < '3.0'", "extra-only; extra == 'x'")
    b = wheel(tmp_path, "beta", "2.5", "delta>=1.4,<2", "hf-xet>=1.6")
    bundled = {"alpha": ("1.0", a), "beta": ("2.5", b)}

    def machine(have: dict[str, str]):
        return have.get

    problems, notes = wheels.unmet(["alpha"], bundled, machine({"gamma": "0.1", "delta": "1.5"}))
    unused = wheels.UNUSED["hf-xet"]
    assert problems == [] and notes == [f"beta 2.5 needs hf-xet>=1.6: neither the bundle nor this machine has it ({unused})"]
    # One level down, through the bundled beta: delta too old, then missing.
    problems, _ = wheels.unmet(["alpha"], bundled, machine({"gamma": "0.1", "delta": "1.2"}))
    assert problems == ["beta 2.5 needs delta<2,>=1.4; this machine has 1.2"]
    problems, _ = wheels.unmet(["alpha", "zeta>=3"], bundled, machine({"delta": "1.5", "zeta": "2"}))
    assert problems == [
        "h3core needs zeta>=3; this machine has 2",
        "alpha 1.0 needs gamma: neither the bundle nor this machine has it",
    ]
    # On the device a version out of range is a warning, a missing distribution still a problem.
    problems, notes = wheels.unmet(["alpha", "zeta>=3"], bundled, machine({"delta": "1.5", "zeta": "2"}), strict=False)
    assert problems == ["alpha 1.0 needs gamma: neither the bundle nor this machine has it"]
    assert "WARNING: h3core needs zeta>=3; this machine has 2: the check goes on with it" in notes
    # A bundled wheel at a version the requirement refuses is named as the bundle's.
    problems, _ = wheels.unmet(["beta>=3"], bundled, machine({"delta": "1.5"}))
    assert problems == ["h3core needs beta>=3; the bundle has 2.5"]
    # An image package whose version the list does not give is taken as it comes.
    assert wheels.unmet(["alpha"], bundled, machine({"gamma": wheels.UNKNOWN, "delta": wheels.UNKNOWN}))[0] == []


def root_names() -> set[str]:
    from packaging.requirements import Requirement

    return {wheels.norm(Requirement(r).name) for r in wheels.roots(ROOT / "pyproject.toml")}


def test_the_roots_are_what_the_check_runs_of_h3core():
    wanted = root_names()
    assert {"pydantic-settings", "anyio", "diffusers", "transformers", "torch", "av", "sageattention"} <= wanted
    assert not any(name.startswith("h3core") for name in wanted) and "litestar" not in wanted


def test_bundling_stops_naming_what_neither_the_bundle_nor_the_images_list_has(tmp_path):
    folder = tmp_path / "b"
    wheel(folder, "pydantic_settings", "2.16.3", "pydantic>=2.7", "python-dotenv>=0.21")
    (folder / "manifest.json").write_text(json.dumps({"implementation": "cp", "pythons": ["3.12"], "machine": "x86_64"}))
    image = tmp_path / "image.txt"
    listed = sorted(root_names() - {"pydantic-settings"})
    image.write_text("# the image\n" + "".join(f"{n}\n" for n in listed) + "pydantic==2.11.0\n")
    done = run(sys.executable, "bench/gpu/wheels.py", "needs", str(folder), str(image))
    assert done.returncode == 4, done.stdout + done.stderr
    missing = "MISSING: pydantic-settings 2.16.3 needs python-dotenv>=0.21: neither the bundle nor this machine has it"
    assert missing in done.stdout
    image.write_text(image.read_text() + "python-dotenv\n")
    done = run(sys.executable, "bench/gpu/wheels.py", "needs", str(folder), str(image))
    assert done.returncode == 0 and "every requirement of what the check runs is met" in done.stdout, done.stdout


def test_a_gpu_check_whose_bundle_needs_what_the_machine_lacks_stops_at_the_wheels_step(tmp_path):
    folder = tmp_path / "b"
    tag = f"py{sys.version_info[0]}-none-any"
    wheel(folder, "sageattention", "1.0.6", tag=tag)  # a root of what the check runs, not on a CPU
    wheel(folder, "h3_planted", "1.0", "no-such-distribution-h3>=1", tag=tag)
    me = f"{sys.version_info[0]}.{sys.version_info[1]}"
    (folder / "manifest.json").write_text(json.dumps({"implementation": "cp", "pythons": [me], "machine": "x86_64"}))
    env = {"PYTHON": sys.executable, "H3GPU_WHEELS": str(folder), "OUT": str(tmp_path / "out"), "H3GPU_WORK": str(tmp_path / "w")}
    done = run("bash", "bench/gpu_check.sh", env={**env, "H3GPU_DRY": ""}, timeout=120)
    assert done.returncode == 1, done.stdout[-2000:]
    assert "install h3-planted 1.0: missing here" in done.stdout
    assert "MISSING: h3-planted 1.0 needs no-such-distribution-h3>=1: neither the bundle nor this machine has it" in done.stdout
    assert "MISSING: h3core" not in done.stdout  # the rest of what it runs is on this machine
    assert "STOPPED after 1 wheels" in done.stdout and "1b environment" not in done.stdout


@pytest.mark.slow  # imports torch
def test_env_stops_when_an_import_every_later_step_needs_fails(tmp_path):
    (tmp_path / "httpcore2").mkdir()  # what a bundle without httpcore2 did to huggingface-hub, so to diffusers
    (tmp_path / "httpcore2" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'httpcore2'\")\n")
    env = {"PYTHONPATH": f"{tmp_path}:{ROOT}", "H3GPU_DRY": "cpu", "OUT": str(tmp_path / "out")}
    done = run(sys.executable, "-m", "bench.gpu.env", env=env, timeout=300)
    assert done.returncode == 1, done.stdout[-2000:] + done.stderr[-2000:]
    assert "import h3core: ok" in done.stdout and "import diffusers.modular_pipelines.minimax_h3: FAILS" in done.stdout
    assert "STOP: diffusers.modular_pipelines.minimax_h3, transformers do(es) not import (above)" in done.stdout
