"""A deliberate schema change, made to a copy of the package only: `admitted.tokens` renamed
`token_count` at version 2, with its upcaster. The golden sets must replay to the same states
under the changed code, and fail to without the upcaster (so the check can fail)."""

from __future__ import annotations

import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import h3core

from .test_golden import SETS

# (file, old, new): each must occur in the package as it is, or the test says what moved.
RENAME = [
    (
        "domain/events.py",
        'type: Literal["admitted"] = "admitted"\n'
        "    # The request's token count where the admission policy computed one (capacity evidence).\n"
        "    tokens: int | None = None",
        'v: int = Field(default=2, ge=1)\n    type: Literal["admitted"] = "admitted"\n    token_count: int | None = None',
    ),
    (
        "domain/state.py",
        '"admitted_at": event.at, "tokens": body.tokens}',
        '"admitted_at": event.at, "tokens": body.token_count}',
    ),
    ("domain/admission.py", "Admitted(tokens=admit.tokens)", "Admitted(token_count=admit.tokens)"),
]
UPCASTER = """

@upcaster("admitted", 1)
def _admitted_tokens_renamed(body):
    body = dict(body)
    body["token_count"] = body.pop("tokens", None)
    return body
"""

CHECK = textwrap.dedent(
    """
    import json, shutil, sys, tempfile
    from pathlib import Path

    import h3core
    from h3core.adapters.store.sqlite import SQLiteEventStore
    from h3core.domain.events import VERSIONS, Admitted, event_from_json, body_from_json
    from h3core.domain.state import fold
    from h3core.domain.upcasting import NewerBody

    assert h3core.__file__.startswith(sys.argv[1]), h3core.__file__  # the changed copy runs

    def dumped(state, recorded):  # fields added since the set was written: at their defaults, and left out
        out = left_out(state.model_dump(mode="json"), recorded)
        if isinstance(out.get("request"), dict) and isinstance(recorded.get("request"), dict):
            out["request"] = left_out(out["request"], recorded["request"])
        return out

    def left_out(out, recorded):
        assert all(out[k] in (None, [], 0, "exact") for k in set(out) - set(recorded))
        return {k: v for k, v in out.items() if k in recorded}

    assert VERSIONS["admitted"] == 2
    tmp = Path(tempfile.mkdtemp())
    for folder in map(Path, sys.argv[2:]):
        states = json.loads((folder / "states.json").read_text())
        logs = {}
        for line in (folder / "export.jsonl").read_text().splitlines():
            e = event_from_json(line)
            logs.setdefault(e.job_id, []).append(e)
        for job_id, events in logs.items():
            assert dumped(fold(events), states[job_id]) == states[job_id], (folder.name, job_id)
        admitted = [e.body for log in logs.values() for e in log if e.type == "admitted"]
        assert admitted and all(b.v == 2 for b in admitted)
        assert {b.token_count for b in admitted} >= {7424, None}
        shutil.copy(folder / "store.db", tmp / f"{folder.name}.db")
        store = SQLiteEventStore(tmp / f"{folder.name}.db")
        for job_id, state in states.items():
            assert dumped(store.get(job_id), state) == state, (folder.name, job_id)
        fresh = SQLiteEventStore(tmp / f"{folder.name}-fresh.db")
        events = [e for log in logs.values() for e in log]
        assert fresh.import_events(events) == len(events) and fresh.import_events(events) == 0
    written = Admitted(token_count=5).model_dump_json()
    assert json.loads(written)["v"] == 2 and body_from_json(written) == Admitted(token_count=5)
    try:
        body_from_json('{"v": 3, "type": "admitted", "token_count": 5}')
    except NewerBody as exc:
        print("newer refused:", exc)
    else:
        raise AssertionError("a body from a newer h3core was read")
    print("replayed", len(sys.argv) - 2, "sets")
    """
)


def changed_copy(tmp_path: Path, *, upcaster: bool) -> Path:
    root = tmp_path / ("with" if upcaster else "without")
    package = root / "h3core"
    shutil.copytree(Path(h3core.__file__).parent, package, ignore=shutil.ignore_patterns("__pycache__"))
    for name, old, new in RENAME:
        path = package / name
        text = path.read_text()
        assert text.count(old) >= 1, f"{name} no longer has {old!r}: update this test's rename"
        path.write_text(text.replace(old, new))
    if upcaster:
        path = package / "domain" / "upcasting.py"
        path.write_text(path.read_text() + UPCASTER)
    return root


def run(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-c", CHECK, str(root), *map(str, SETS)],
        env={"PYTHONPATH": str(root), "PATH": "/usr/bin:/bin"},
        cwd=root,  # `-c` puts the working directory first on sys.path
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("upcaster", [True, False], ids=["with-upcaster", "without"])
def test_golden_logs_replay_after_a_renamed_field_only_with_its_upcaster(tmp_path, upcaster):
    done = run(changed_copy(tmp_path, upcaster=upcaster))
    if upcaster:
        assert done.returncode == 0, done.stderr
        assert f"replayed {len(SETS)} sets" in done.stdout
        assert "this h3core reads up to version 2" in done.stdout
    else:
        assert done.returncode != 0
        assert "no upcaster takes 'admitted' bodies from version 1" in done.stderr, done.stderr
