"""Recovery's question about a running attempt's video: was it finished before h3core stopped?

An executor commits its video (the artifact store's rename, then a record of what it wrote) before
the runner writes `Done`; a crash between the two leaves a finished video that no event names.
Recovery adopts it when the file on disk is the one the commit recorded, byte for byte (size and
sha256), instead of running the attempt again. A crash may also stop the commit before its record,
the encoder done: the staged video is whole, and only the file can say so. `Expected` is what
recovery asks of it (the frames the attempt's request makes, at its rate), so that a staged file
cut short is never taken for the video. Pure: the artifact store reads the facts.
"""

from __future__ import annotations

from dataclasses import dataclass

from pydantic import BaseModel, ConfigDict

from h3core.domain.capabilities import Capabilities
from h3core.domain.events import Artifact, Body, Done, Recovered
from h3core.domain.state import JobState


class FoundArtifact(BaseModel):
    """What the artifact store holds for one attempt: the commit's record, and the file as it is now."""

    model_config = ConfigDict(frozen=True)

    attempt: int
    recorded: Artifact
    size: int | None  # None: the file is gone
    sha256: str | None  # None: not read


@dataclass(frozen=True)
class Expected:
    """What the running attempt's video holds when whole: the frames its executor makes of the
    request, at the request's rate. A staged video no commit recorded is committed at recovery
    only where it reads whole and `holds` these."""

    frames: int
    fps: int

    @property
    def duration_s(self) -> float:
        """The video's length, as its commit records it (frames / fps)."""
        return self.frames / self.fps

    def holds(self, frames: int, seconds: float) -> bool:
        """Whether a video of `frames` frames lasting `seconds` is this one (the length within half a frame)."""
        return frames == self.frames and abs(seconds - self.duration_s) <= 0.5 / self.fps


def expected(state: JobState, caps: Capabilities) -> Expected:
    """What the video of `state`'s running attempt holds when whole, on the executor of `caps`."""
    return Expected(frames=caps.frames_made(state.request), fps=state.request.fps)


@dataclass(frozen=True)
class Adopt:
    """The running attempt's committed video checks against its record: the job ends with `artifact` (`adoption`)."""

    artifact: Artifact


@dataclass(frozen=True)
class Discard:
    """A record was found but the file does not match it: the attempt runs again."""

    reason: str


def mismatch(recorded: Artifact, size: int | None, sha256: str | None) -> str | None:
    """How the file on disk differs from the recorded video, or None when it is that video.
    `size` None: the file is gone; `sha256` None: not hashed (only the size is compared)."""
    if size is None:
        return f"its video {recorded.path} is missing"
    if size != recorded.bytes:
        return f"its video {recorded.path} has {size} bytes, {recorded.bytes} were recorded"
    if sha256 is not None and sha256 != recorded.sha256:
        return f"its video {recorded.path} does not match the recorded sha256"
    return None


def judge(state: JobState, found: FoundArtifact | None) -> Adopt | Discard | None:
    """Adopt the running attempt's committed video if it checks; None when nothing was committed."""
    if found is None or state.status != "running":
        return None
    if found.attempt != state.attempt:
        return Discard(f"the video found is attempt {found.attempt}'s, not the running attempt {state.attempt}'s")
    if found.size is not None and found.sha256 is None:
        return Discard(f"its video {found.recorded.path} was not hashed")
    reason = mismatch(found.recorded, found.size, found.sha256)
    return Discard(reason) if reason is not None else Adopt(found.recorded)


def adoption(state: JobState, adopt: Adopt) -> list[Body]:
    """The events that end the job with its recovered video, appended together (a cancel requested
    before the crash came too late: the video was finished)."""
    done = Done(artifact=adopt.artifact, tokens=state.tokens, cancel_too_late=state.cancel_requested)
    return [Recovered(attempt=state.attempt, artifact=adopt.artifact), done]
