"""An exclusive, non-blocking file lock: at most one runner per store.

Two runners on one store would both recover the "running" jobs of the other as interrupted and
both claim queued jobs. The store's optimistic concurrency keeps the log legal, but the runners
would still fight over work, so a worker takes `RunnerLock(f"{db}.runner.lock")` for its whole
lifetime and refuses to start if another process holds it.

The lock is `fcntl.flock(LOCK_EX | LOCK_NB)` on an open file descriptor: the kernel releases it
when the process exits, however it exits (SIGKILL and power loss included), so a crashed worker
never leaves a stale lock behind. The file itself is never deleted (deleting it would let a
second process lock a fresh file while the first still holds the unlinked one); it holds the
holder's pid, for the message the next worker prints. POSIX only; local filesystems only (flock
over NFS is not reliable).
"""

from __future__ import annotations

import fcntl
import os
import time
from pathlib import Path
from types import TracebackType


def runner_lock_path(db: str | Path) -> Path:
    """The lock a store's runner holds: beside the store file."""
    return Path(f"{db}.runner.lock")


class LockHeld(RuntimeError):
    """Another process holds the lock."""

    def __init__(self, path: Path, holder: str | None) -> None:
        who = f"process {holder}" if holder else "another process"
        super().__init__(f"{path} is held by {who}")
        self.path = path
        self.holder = holder


class RunnerLock:
    """`with RunnerLock(path):` holds an exclusive lock on `path` or raises `LockHeld` at once."""

    def __init__(self, path: str | Path) -> None:
        self.path = Path(path)
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        """Whether this object holds the lock now."""
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock (after a few short tries, as `holder` may hold it an instant) and write
        this process's pid into the file; `LockHeld` if another process holds it."""
        if self._fd is not None:
            raise RuntimeError(f"{self.path} is already held by this object")
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            # A few tries: `holder()` takes a shared lock for an instant to look.
            for wait in (0.01, 0.05, 0.1, 0.25, None):
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                    break
                except BlockingIOError:
                    if wait is None:
                        raise
                    time.sleep(wait)
        except BlockingIOError:
            holder = os.pread(fd, 64, 0).decode(errors="replace").strip() or None
            os.close(fd)
            raise LockHeld(self.path, holder) from None
        except BaseException:
            os.close(fd)
            raise
        os.ftruncate(fd, 0)
        os.pwrite(fd, f"{os.getpid()}\n".encode(), 0)
        self._fd = fd

    @staticmethod
    def holder(path: str | Path) -> str | None:
        """Who holds the lock at `path` now (its pid as written), or None if no one does.
        Looks without taking it for longer than an instant."""
        try:
            fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            return os.pread(fd, 64, 0).decode(errors="replace").strip() or "another process"
        finally:
            os.close(fd)  # closing the descriptor also drops the shared lock, if we got it
        return None

    def release(self) -> None:
        """Drop the lock, if this object holds it; the file stays."""
        fd, self._fd = self._fd, None
        if fd is not None:
            try:
                fcntl.flock(fd, fcntl.LOCK_UN)
            finally:
                os.close(fd)

    def __enter__(self) -> RunnerLock:
        self.acquire()
        return self

    def __exit__(self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None) -> None:
        self.release()
