"""The core imports light, and the README's library example runs (here; a fresh venv: tests/integration/test_install.py)."""

from __future__ import annotations

import subprocess
import sys

from tests.readme import check_example_output, library_example

# Everything an extra brings; all installed in the test venv, so the check below can fail.
OPTIONAL = (
    "litestar",
    "uvicorn",
    "httpx",
    "httpx_sse",
    "websockets",
    "prometheus_client",
    "torch",
    "diffusers",
    "transformers",
    "av",
    "numpy",
    "pandas",
    "ray",
    "PIL",
    "aiohttp",
    "swagger_ui",
    "standardwebhooks",
    "jinja2",
    "playwright",
    "psycopg",
    "psycopg_pool",
    "boto3",
    "botocore",
)


def test_import_h3core_and_its_cli_load_no_optional_dependency():
    code = (
        "import importlib.util, sys\n"
        f"optional = {OPTIONAL!r}\n"
        "assert all(importlib.util.find_spec(m) for m in optional if m != 'pandas'), 'the test venv lacks an extra'\n"
        "import h3core, h3core.cli, h3core.runtime.jobs\n"
        "print(' '.join(sorted(m for m in optional if m in sys.modules)))\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "", f"`import h3core` loaded {result.stdout.strip()}"


def test_the_readme_library_example_runs_a_job_to_done(tmp_path):
    script = tmp_path / "example.py"
    script.write_text(library_example())
    result = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, timeout=120, cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    job_id = check_example_output(result.stdout)
    assert (tmp_path / "jobs.db").exists() and list((tmp_path / "artifacts" / job_id).glob("attempt-1.*"))
