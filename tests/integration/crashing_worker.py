"""`h3core worker`, killed by SIGKILL at a chosen point of the artifact write path (the real one).

    python tests/integration/crashing_worker.py {before_commit|after_record|after_commit} worker --db ... [worker args]

`after_commit`: the video's record is written and the video renamed into place, then the process
dies before `commit` returns, so the runner never writes `Done`: a finished video no event names.
`after_record`: the record is written, the process dies before the rename: a complete `.part`
that its record names. `before_commit`: the staged `.part` file is complete, the process dies
before anything records it.
Deterministic: the kill happens in the commit call itself, not at a time a test guesses.
"""

from __future__ import annotations

import os
import signal
import sys

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.cli import app

_commit = LocalArtifactStore.commit
_write_record = LocalArtifactStore._write_record


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _before(self, staged, **kw):
    _die()


def _after(self, staged, **kw):
    _commit(self, staged, **kw)
    _die()


def _after_record(self, *args, **kw):
    _write_record(self, *args, **kw)
    _die()


if __name__ == "__main__":
    at = sys.argv.pop(1)
    if at == "after_record":
        LocalArtifactStore._write_record = _after_record
    else:
        LocalArtifactStore.commit = {"before_commit": _before, "after_commit": _after}[at]
    app()
