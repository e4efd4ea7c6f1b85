"""Deleted videos removed by whichever node holds them: every node with an artifact store removes
its own files of the videos the store records deleted (`mark_video_deleted`: DELETE /v1/videos/{id}).

Nodes may each keep their own artifacts folder, and the node that answers a DELETE need not hold
the file. The store's mark is the fact every node acts on: no route serves a video marked deleted,
whoever holds its file (h3core.service.files), and this sweep makes the node that holds the file
remove it. It follows the store's deletions (`video_deletions`, gap-free in the order they were
marked) from where it last looked: its first sweep, at start, reads them all through the store's
index of them, each later one only those marked since, so a sweep with nothing new is one indexed
read. A deletion of a job that has ended with a video this node holds removes that file as DELETE
removes one (`ArtifactStore.delete`: when, recorded beside it, then the file) and records the
video deleted in this node's artifact store too; a job not ended when its deletion is read (its
cancel is on its way, and it may still finish `done` with a video) is looked at again each sweep
until it has ended. Runs off the event loop, on a worker thread; a sweep the store fails is tried
again at the next.
"""

from __future__ import annotations

import logging

import anyio
from anyio.abc import TaskStatus

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.base import JobProjections
from h3core.domain.state import TERMINAL

__all__ = ["DeletionSweep"]

log = logging.getLogger("h3core.store")


class DeletionSweep:
    """Removes this node's files of videos the store records deleted, every `interval_s` (the
    module docstring). `position`: the last deletion it has read."""

    def __init__(self, store: JobProjections, artifacts: ArtifactStore, interval_s: float = 2.0, *, batch: int = 1000) -> None:
        self.store = store
        self.artifacts = artifacts
        self.interval_s = interval_s
        self.batch = batch
        self.position = 0
        self.sweeps = 0
        self._unended: set[str] = set()  # deleted while not ended: looked at again until they end

    def sweep(self) -> list[str]:
        """Remove this node's files of the videos deleted since the last sweep, and of those found
        not ended before that have ended since; the paths it removed. Blocking: a worker thread's."""
        ended: dict[str, str | None] = {}
        while True:
            rows = self.store.video_deletions(self.position, self.batch)
            for d in rows:
                self.position = d.position
                if d.status in TERMINAL:
                    ended[d.job_id] = d.path
                else:
                    self._unended.add(d.job_id)
            if len(rows) < self.batch:
                break
        for job_id in sorted(self._unended):
            state = self.store.get(job_id)
            if state is None or state.terminal:
                self._unended.discard(job_id)
                ended[job_id] = state.artifact.path if state is not None and state.artifact is not None else None
        removed = [path for job_id, path in ended.items() if path is not None and self._remove(job_id, path)]
        self.sweeps += 1
        return removed

    def _remove(self, job_id: str, path: str) -> bool:
        try:
            size, _ = self.artifacts.measure(path, hashed=False)
        except ValueError:
            return False  # a recorded path outside the store: nothing of it is here
        if size is None:
            return False  # another node's file (or removed already)
        self.artifacts.delete_video(job_id)
        self.artifacts.delete(path)
        log.info("job %s: removed its video %s, recorded deleted", job_id, path, extra={"job_id": job_id, "file": path})
        return True

    async def run(self, *, task_status: TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        """Sweep now, then every `interval_s`, until cancelled; a sweep that fails (the store, the
        disk) is logged and tried again at the next."""
        task_status.started()
        failing: str | None = None  # logged once while it lasts, not at every sweep
        while True:
            try:
                await anyio.to_thread.run_sync(self.sweep)
                failing = None
            except Exception as exc:
                if str(exc) != failing:
                    log.warning("could not remove the files of deleted videos: %s", exc, extra={"error": str(exc)})
                failing = str(exc)
            await anyio.sleep(self.interval_s)
