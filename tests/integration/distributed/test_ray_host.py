"""Ray kills a local head when the *thread* that started it ends (Linux PR_SET_PDEATHSIG), and a
pooled thread ends when it is retired for being idle. `RayHost` starts Ray on a thread of its
own that lives until `close`, so a head asked for from a thread that ends lives on. Each case
runs in a process of its own (one Ray per process; this package's tests share another)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.timeout(300)
ROOT = Path(__file__).resolve().parents[3]


def ask_from_a_thread_that_ends(how: str) -> dict:
    run = subprocess.run(
        [sys.executable, "-m", "tests.integration.distributed.head_owner", how], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    last = run.stdout.strip().splitlines()[-1:] or [""]
    assert run.returncode == 0 and last[0].startswith("{"), f"exit {run.returncode}\n{run.stdout[-3000:]}\n{run.stderr[-3000:]}"
    return json.loads(last[0])


def test_a_head_started_on_a_thread_that_ends_dies_with_it():
    assert ask_from_a_thread_that_ends("thread") == {"gcs_alive": False}


def test_a_head_asked_of_a_host_from_a_thread_that_ends_lives_until_the_host_closes():
    assert ask_from_a_thread_that_ends("host") == {"answered": True, "gcs_alive": True, "gcs_alive_after_close": False}

