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

With `s3://` artifacts (h3core.adapters.artifacts.s3: the commit uploads the staged video with
its record as the object's metadata), the modes of the upload:

- `before_upload`: the staged video whole and hashed, the process dies as its upload starts.
- `mid_upload`: dies once the first part of the multipart upload is stored (boto3's
  `after-call.s3.UploadPart` event on the store's own client): an upload begun, never completed.
- `after_upload`: the object is up with its record, the process dies before `commit` returns.
- `none`: no kill (the nodes beside the crashing one run the same program).

A long video's segments (the fake with `--fake-window-seconds`):

- `in_segment`: the process dies as the third segment's file (index 2) goes into the store: the
  two before it are stored and logged.
- `segment_unlogged`: the second segment's file (index 1) is stored, the process dies before its
  `segment_done` is written: a whole segment file no event names.

`CRASHING_FAKE_ENCODING=y4m` in the environment makes the fake executor write YUV4MPEG2 (raw
frames: about 24 kB a frame at its 128-pixel size) where it would write a small mp4, so that a
video is large enough to go up in parts.

Deterministic: the kill happens in the commit call itself, not at a time a test guesses.
"""

from __future__ import annotations

import os
import signal
import sys

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.artifacts.s3 import S3ArtifactStore
from h3core.cli import app

_commit = LocalArtifactStore.commit
_write_record = LocalArtifactStore._write_record
_s3_init = S3ArtifactStore.__init__
_s3_commit = S3ArtifactStore.commit
_put_segment = LocalArtifactStore.put_segment

# The modes whose kill leaves a whole video (the encoder had closed it), in write-path order.
WHOLE = ("before_commit", "before_record", "after_record", "after_commit")
MODES = ("mid_write", *WHOLE)
S3_MODES = ("before_upload", "mid_upload", "after_upload", "none")
SEGMENT_MODES = ("in_segment", "segment_unlogged")


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


def _s3_before_upload(self, local, artifact):
    _die()


def _s3_after_upload(self, staged, **kw):
    _s3_commit(self, staged, **kw)
    _die()


def _s3_mid_upload(self, *args, **kw):
    _s3_init(self, *args, **kw)
    self.s3.meta.events.register("after-call.s3.UploadPart", lambda **_: _die())


def _in_segment(self, staged, **kw):
    if kw["index"] == 2:
        _die()
    return _put_segment(self, staged, **kw)


def _segment_unlogged(self, staged, **kw):
    made = _put_segment(self, staged, **kw)
    if kw["index"] == 1:
        _die()
    return made


def _s3(at: str) -> None:
    if at == "before_upload":
        S3ArtifactStore.put_committed = _s3_before_upload
    elif at == "mid_upload":
        S3ArtifactStore.__init__ = _s3_mid_upload
    elif at == "after_upload":
        S3ArtifactStore.commit = _s3_after_upload


if __name__ == "__main__":
    at = sys.argv.pop(1)
    if os.environ.get("CRASHING_FAKE_ENCODING"):
        import h3core.executors.fake as fake

        encoding = os.environ["CRASHING_FAKE_ENCODING"]
        fake.default_encoding = lambda: encoding
    if at in S3_MODES:
        _s3(at)
    elif at in SEGMENT_MODES:
        LocalArtifactStore.put_segment = {"in_segment": _in_segment, "segment_unlogged": _segment_unlogged}[at]
    elif at in ("before_record", "after_record"):
        LocalArtifactStore._write_record = {"before_record": _before_record, "after_record": _after_record}[at]
    else:
        LocalArtifactStore.commit = {"mid_write": _mid_write, "before_commit": _before, "after_commit": _after}[at]
    app()
