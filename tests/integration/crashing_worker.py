"""`h3core worker`, killed by SIGKILL at a chosen point of the artifact write path (the real one).

    python tests/integration/crashing_worker.py MODE worker --db ... [worker args]

The write path is staging → the encoder writes the `.part` and closes it → commit (fsync, hash,
record, rename) → the runner writes `Done`. The modes, in that order:

- `mid_write`: the `.part` cut short (half its bytes, as a kill while the encoder writes leaves
  it), the process dies before the commit: not a whole video, never to be adopted.
- `before_commit`: the encoder closed a complete `.part`; the process dies as the commit starts.
- `before_record`: inside the commit, the `.part` fsynced and hashed, the process dies before the
  record is written: a complete `.part` that nothing records yet.
- `after_record`: the record is written, the process dies before the rename: a complete `.part`
  that its record names.
- `after_commit`: the video's record is written and the video renamed into place, then the
  process dies before `commit` returns, so the runner never writes `Done`: a finished video no
  event names.

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

# The modes whose kill leaves a whole video (the encoder had closed it), in write-path order.
WHOLE = ("before_commit", "before_record", "after_record", "after_commit")
MODES = ("mid_write", *WHOLE)


def _die() -> None:
    sys.stdout.flush()
    os.kill(os.getpid(), signal.SIGKILL)


def _mid_write(self, staged, **kw):
    os.truncate(staged, os.path.getsize(staged) // 2)
    _die()


def _before(self, staged, **kw):
    _die()


def _after(self, staged, **kw):
    _commit(self, staged, **kw)
    _die()


def _before_record(self, *args, **kw):
    _die()


def _after_record(self, *args, **kw):
    _write_record(self, *args, **kw)
    _die()


if __name__ == "__main__":
    at = sys.argv.pop(1)
    if at in ("before_record", "after_record"):
        LocalArtifactStore._write_record = {"before_record": _before_record, "after_record": _after_record}[at]
    else:
        LocalArtifactStore.commit = {"mid_write": _mid_write, "before_commit": _before, "after_commit": _after}[at]
    app()
