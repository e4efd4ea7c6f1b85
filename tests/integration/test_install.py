"""`pip install h3core` with no extras, in a fresh venv: no Litestar, torch, PyAV or numpy comes
with it, and the core works there: the README's library example, the store commands, the worker
on the fake, and `serve` saying which extra it needs.

Needs the package index (as scripts/test does); it fails, never skips, when that is unreachable.
Fast path: the wheel is built here with the test venv's setuptools, the venv is made without
pip, and the test venv's pip installs into it (`pip --python`), from pip's cache when warm.
"""

from __future__ import annotations

import importlib.metadata
import json
import shutil
import signal
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from h3core import SQLiteEventStore
from tests.integration.conftest import clean_env, poll
from tests.readme import check_example_output, library_example

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

ROOT = Path(__file__).resolve().parents[2]
# Distribution names of what the extras bring; none may come with the core.
NOT_IN_CORE = (
    "litestar",
    "uvicorn",
    "httpx",
    "prometheus-client",
    "websockets",
    "torch",
    "diffusers",
    "transformers",
    "av",
    "numpy",
    "pillow",
    "ray",
    "swagger-ui-py",
    "standardwebhooks",
    "boto3",
    "botocore",
)


def _wheel(out: Path) -> Path:
    """A wheel of this checkout's working tree (copied, so no build output lands in the tree)."""
    src = out / "src"
    shutil.copytree(ROOT / "h3core", src / "h3core", ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    for name in ("pyproject.toml", "README.md"):
        shutil.copy(ROOT / name, src / name)
    setuptools = tuple(int(p) for p in importlib.metadata.version("setuptools").split(".")[:2])
    # setuptools >= 70.1 builds wheels by itself: no isolated build env to fetch. Older: pip fetches one.
    isolation = ["--no-build-isolation"] if setuptools >= (70, 1) else []
    subprocess.run(
        [sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", *isolation, "-w", out / "dist", src], check=True, timeout=300
    )
    [wheel] = (out / "dist").glob("h3core-*.whl")
    return wheel


@pytest.fixture(scope="module")
def core(tmp_path_factory) -> Path:
    """A fresh venv with `h3core` and nothing else asked for; its bin folder."""
    base = tmp_path_factory.mktemp("fresh")
    wheel = _wheel(base)
    venv.create(base / "venv", with_pip=False)
    python = base / "venv" / "bin" / "python"
    subprocess.run([sys.executable, "-m", "pip", "--python", python, "install", "-q", wheel], check=True, timeout=500)
    return python.parent


def run(bin_dir: Path, *args: object, cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(a) for a in args], cwd=cwd, env=clean_env(), capture_output=True, text=True, timeout=timeout)


def test_the_core_install_brings_no_extra(core, tmp_path):
    listed = run(
        core,
        core / "python",
        "-c",
        "import importlib.metadata as m, json; print(json.dumps(sorted(d.metadata['Name'].lower() for d in m.distributions())))",
        cwd=tmp_path,
    )
    installed = set(json.loads(listed.stdout))
    assert "h3core" in installed and {"pydantic", "anyio", "sqlite-utils"} <= installed
    assert installed.isdisjoint(NOT_IN_CORE), sorted(installed & set(NOT_IN_CORE))
    where = run(core, core / "python", "-c", "import h3core, h3core.cli; print(h3core.__file__)", cwd=tmp_path)
    assert where.returncode == 0, where.stderr
    assert Path(where.stdout.strip()).is_relative_to(core.parent), "h3core must come from the fresh venv, not the checkout"


def test_the_readme_library_example_runs_to_done_in_the_core_install(core, tmp_path):
    (tmp_path / "example.py").write_text(library_example())
    result = run(core, core / "python", "example.py", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id = check_example_output(result.stdout)
    [video] = (tmp_path / "artifacts" / job_id).glob("attempt-1.*[!n]")  # not the .record.json
    assert video.suffix == ".y4m" and video.read_bytes().startswith(b"YUV4MPEG2 W128 H72 F24:1")  # no PyAV: y4m

    h3 = core / "h3core"
    replay = run(core, h3, "replay", job_id, "--db", "jobs.db", cwd=tmp_path)
    assert replay.returncode == 0 and "done" in replay.stdout, replay.stderr
    verify = run(core, h3, "verify", "--db", "jobs.db", "--artifacts", "artifacts", cwd=tmp_path)
    assert verify.returncode == 0, verify.stdout + verify.stderr
    assert run(core, h3, "export", "--db", "jobs.db", "-o", "log.jsonl", cwd=tmp_path).returncode == 0
    imported = run(core, h3, "import", "log.jsonl", "--db", "copy.db", cwd=tmp_path)
    assert imported.returncode == 0, imported.stderr
    assert job_id in run(core, h3, "jobs", "--db", "copy.db", cwd=tmp_path).stdout
    gc = run(core, h3, "gc", "--db", "jobs.db", "--artifacts", "artifacts", "--dry-run", cwd=tmp_path)
    assert gc.returncode == 0, gc.stderr


def test_the_core_worker_runs_the_fake_and_serve_names_its_extra(core, tmp_path):
    h3 = core / "h3core"
    enqueued = run(
        core,
        h3,
        "enqueue",
        "--db",
        "w.db",
        "--prompt",
        "a fox",
        "--width",
        64,
        "--height",
        64,
        "--frames",
        12,
        "--steps",
        2,
        cwd=tmp_path,
    )
    assert enqueued.returncode == 0, enqueued.stderr
    job_id = enqueued.stdout.strip()
    log = tmp_path / "worker.log"
    with open(log, "wb") as out:
        worker = subprocess.Popen(
            [
                h3,
                "worker",
                "--db",
                "w.db",
                "--artifacts",
                "art",
                "--executor",
                "fake",
                "--fake-step-seconds",
                "0",
                "--poll-interval",
                "0.1",
            ],
            cwd=tmp_path,
            env=clean_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )
    try:
        store = SQLiteEventStore(tmp_path / "w.db")
        try:
            state = poll(lambda: (s := store.get(job_id)).terminal and s, 120, "the job to end", log.read_text)
        finally:
            store.close()
        assert state.status == "done" and state.artifact.path.endswith(".y4m"), log.read_text()
        worker.send_signal(signal.SIGTERM)
        assert worker.wait(30) == 0, log.read_text()
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait(10)

    for command, extra in ((["serve"], "service"), (["submit", "--prompt", "a fox"], "client")):
        refused = run(core, h3, *command, cwd=tmp_path)
        assert refused.returncode == 2, refused.stderr
        assert f"pip install 'h3core[{extra}]'" in refused.stderr and "Traceback" not in refused.stderr
