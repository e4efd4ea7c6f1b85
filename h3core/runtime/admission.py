"""The live admission contract: the pure `AdmissionRules`, rebuilt whenever what the executor can run
changes (a ComfyUI came back, a model finished loading, a group died).

The capabilities come from a source: the executor itself when it runs in this process, or the
file a runner process publishes beside the store (`CapabilityFile`) for an API process that
admits jobs another process runs. Either way, submission and `/v1/ceilings` judge with the
same `AdmissionRules`, built from the same capabilities and the capacity profile that describes them.
"""

from __future__ import annotations

import functools
import json
import os
import threading
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Protocol

import anyio

from h3core.adapters.store.location import is_postgres_url, local_dir
from h3core.domain.admission import DEFAULT_MAX_VIDEO_SECONDS, AdmissionRules, CeilingRow, Decision
from h3core.domain.capabilities import MODES, Capabilities, ModeReadiness
from h3core.domain.capacity import CapacityProfile, applicable
from h3core.domain.geometry import Media
from h3core.domain.request import GenerationRequest

if TYPE_CHECKING:
    from h3core.executors.base import Executor

CapabilitySource = Callable[[], Capabilities]


class ServiceAdmission(Protocol):
    """What the service asks of its admission contract: `LocalAdmission` (one executor) or
    `h3core.runtime.fleet.FleetAdmission` (every live node of a shared store)."""

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        """Admit the request (its tokens counted, its frames as they will be made) or refuse it with the limit."""
        ...

    def current(self) -> AdmissionRules:
        """The contract that describes the deployment."""
        ...

    def ceilings(self) -> list[CeilingRow]:
        """The largest request of each shape admitted now (/v1/ceilings' rows)."""
        ...

    def source(self) -> Capabilities:
        """What can run now (readiness, the waiting reasons of queued jobs)."""
        ...


def rules_for(
    caps: Capabilities,
    profiles: Sequence[CapacityProfile],
    explicit: CapacityProfile | None,
    *,
    max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS,
) -> AdmissionRules:
    """The contract of `caps`: the first of `profiles` that describes them gives the budgets;
    `explicit`, the operator's choice, applies whatever the hardware says; `max_video_seconds`: the
    longest video made as segments (H3_MAX_VIDEO_SECONDS)."""
    if explicit is not None:
        profile, effective = applicable([explicit.model_copy(update={"match": ()})], caps)
    else:
        profile, effective = applicable(profiles, caps)
    return AdmissionRules(effective, profile, max_video_seconds=max_video_seconds)


class LocalAdmission:
    """An `AdmissionPolicy` over the executor's current capabilities.

    `profiles` are matched against the capabilities (the first that describes a group gives its
    budget); `profile`, when given, is the operator's explicit choice and applies whatever the
    hardware says."""

    def __init__(
        self,
        source: CapabilitySource,
        profiles: Sequence[CapacityProfile] = (),
        *,
        profile: CapacityProfile | None = None,
        max_video_seconds: float = DEFAULT_MAX_VIDEO_SECONDS,
    ) -> None:
        self.source = source
        self.profiles = tuple(profiles)
        self.explicit = profile
        self.max_video_seconds = max_video_seconds
        self._cached: tuple[Capabilities, AdmissionRules] | None = None
        self._lock = threading.Lock()

    def current(self) -> AdmissionRules:
        """The contract of the capabilities as they are now (built again only when they change)."""
        caps = self.source()
        with self._lock:
            if self._cached is not None and (self._cached[0] is caps or self._cached[0] == caps):
                return self._cached[1]
            contract = rules_for(caps, self.profiles, self.explicit, max_video_seconds=self.max_video_seconds)
            self._cached = (caps, contract)
            return contract

    def decide(self, request: GenerationRequest, media: Mapping[str, Media] | None = None) -> Decision:
        """The current contract's decision on the request."""
        return self.current().decide(request, media)

    def ceilings(self) -> list[CeilingRow]:
        """/v1/ceilings' rows."""
        return self.current().ceilings()


def capabilities_path(db: Path | str) -> Path:
    """Where a runner process publishes its executor's capabilities for an API process on the same
    machine: beside a SQLite store; for PostgreSQL, in the working folder."""
    if is_postgres_url(db):
        return local_dir(db) / "h3core-postgres.capabilities.json"
    return Path(f"{db}.capabilities.json")


class CapabilityFile:
    """Capabilities written by the process running the executor, read by another process.

    Written whole and renamed into place, so a reader sees the old statement or the new one;
    read at most once per `interval_s` (a submit must not pay for a file read)."""

    def __init__(self, path: Path, *, interval_s: float = 0.25, clock: Callable[[], float] | None = None) -> None:
        import time

        self.path = Path(path)
        self.interval_s = interval_s
        self._clock = clock or time.monotonic
        self._read_at = -float("inf")
        self._stamp: tuple[int, int] | None = None
        self._caps: Capabilities | None = None
        self._lock = threading.Lock()

    def publish(self, caps: Capabilities) -> None:
        """Write the statement whole, then rename it into place."""
        tmp = self.path.with_name(self.path.name + f".{os.getpid()}.tmp")
        tmp.write_text(caps.model_dump_json())
        os.replace(tmp, self.path)

    def read(self) -> Capabilities:
        """The last statement read (the file looked at again once `interval_s` has passed); before
        any runner has stated one, `unknown()`: every mode not ready."""
        with self._lock:
            now = self._clock()
            if now - self._read_at >= self.interval_s:
                self._read_at = now
                self._refresh()
            if self._caps is None:
                return unknown()
            return self._caps

    def _refresh(self) -> None:
        try:
            st = self.path.stat()
        except FileNotFoundError:
            self._caps, self._stamp = None, None
            return
        stamp = (st.st_mtime_ns, st.st_size)
        if stamp == self._stamp:
            return
        try:
            self._caps = Capabilities.model_validate(json.loads(self.path.read_text()))
            self._stamp = stamp
        except (OSError, ValueError):
            pass  # replaced while read, or written by another version: keep what we had

    def clear(self) -> None:
        """Remove the statement (its runner has stopped)."""
        self.path.unlink(missing_ok=True)


@functools.cache  # the same object every time: a submit compares it by identity (LocalAdmission)
def unknown(executor: str = "unknown") -> Capabilities:
    """What an API process assumes before any runner process has stated its capabilities."""
    why = "no runner process has stated what it can run yet"
    modes = tuple(ModeReadiness(mode=m, ready=False, reason=why) for m in MODES)
    # Which frame count the video will have is the executor's (the model's 17n + 5, or as asked):
    # unknown here, so nothing is said to be snapped that may not be.
    return Capabilities(executor=executor, modes=modes, exact_frames=MODES)


async def publish_capabilities(executor: Executor, board: CapabilityFile, *, interval_s: float = 0.25) -> None:
    """Publish the executor's capabilities whenever they change, until cancelled; then say that
    nothing runs here any more (an API process then holds its jobs queued, not admitted blind)."""
    last: Capabilities | None = None
    try:
        while True:
            caps = executor.capabilities()
            if caps != last:
                board.publish(caps)  # a small file, rarely: on the loop, not a worker thread
                last = caps
            await anyio.sleep(interval_s)
    finally:
        if last is not None:
            board.publish(last.not_ready("the runner process stopped"))
