"""OpenAI's Videos API in h3core's terms. Pure: no I/O and no clock (callers pass `now`).

- the video object from a job's state (`video_object`), and when to poll it again;
- the create parameters (`size`, `seconds`, `model`, an `input_reference` already stored as an
  upload) to the fields of h3core's own request (`request_fields`); any other field is one of
  h3core's (sent through the SDK's `extra_body`) and passes through as it is;
- the fields the SDK sends as multipart, back into nested data (`unflatten_form`);
- errors in OpenAI's shape (`VideoApiError`, `error_body`).
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator
from pydantic.config import JsonDict

from h3core.domain.ids import JOB_ID_PATTERN
from h3core.domain.request import MAX_FRAMES, MAX_SIDE, MIN_SIDE, SIDE_MULTIPLE, present
from h3core.domain.state import JobState
from h3core.service.requests import JobCreate, Prompt, UploadId, json_object, sides_refusal

FPS = 24
DEFAULT_MODEL = "minimax-h3"
OPENAI_FIELDS = ("prompt", "model", "seconds", "size", "input_reference")
POLL_MS = (100, 5000)  # bounds of the poll interval suggested to a client (openai-poll-after-ms)

VideoStatus = Literal["queued", "in_progress", "completed", "failed"]

# What the create call takes, as the document states it (the handler reads it the same way).
_SIDES = "|".join(str(n) for n in range(MIN_SIDE, MAX_SIDE + 1, SIDE_MULTIPLE))
SIZE_PATTERN = rf"^({_SIDES})x({_SIDES})$"
# A positive number of seconds, at most 999.999 (no more frames than a request may have), up to
# three decimals: 1-999 with a fraction, or 0.001-0.999.
SECONDS_PATTERN = r"^([1-9][0-9]{0,2}(\.[0-9]{1,3})?|0\.([1-9][0-9]{0,2}|0[1-9][0-9]?|00[1-9]))$"
VIDEO_ID_PATTERN = JOB_ID_PATTERN


class FileReference(BaseModel):
    """An image already uploaded (POST /v1/uploads), by its id."""

    model_config = ConfigDict(extra="forbid")
    file_id: UploadId


_B64 = "[A-Za-z0-9+/]"


class ImageUrlReference(BaseModel):
    """An image inline, as a base64 data URL (no remote URL is fetched)."""

    model_config = ConfigDict(extra="forbid")
    image_url: str = Field(pattern=rf"^data:image/(png|jpeg|webp);base64,({_B64}{{4}})*({_B64}{{4}}|{_B64}{{2}}==|{_B64}{{3}}=)$")


def _excludes(name: str, *others: str) -> list[dict]:
    return [{"not": {"allOf": [present(name), {"required": [other]}]}} for other in others]


# An OpenAI parameter and the request field it sets are not given together.
EXCLUSIONS = [*_excludes("size", "width", "height"), *_excludes("seconds", "frames")]
# input_reference is fl2va's first keyframe.
REFERENCE_IS_FIRST_FRAME: JsonDict = {
    "if": present("input_reference"),
    "then": {"properties": {"keyframes": {"type": "null"}, "mode": {"const": "fl2va"}}},
}


class VideoCreate(JobCreate):
    """POST /v1/videos: OpenAI's parameters (`model`, `size`, `seconds`, `input_reference`) and
    h3core's own request fields, as the SDK's `extra_body` sends them. An OpenAI parameter and the
    field it sets are not given together; `input_reference` is fl2va's first keyframe."""

    model_config = ConfigDict(
        json_schema_extra={
            "allOf": [
                {
                    "if": {"required": ["mode"], "properties": {"mode": {"const": "fl2va"}}},
                    "then": {"anyOf": [present("keyframes"), present("input_reference")]},
                    "else": {"properties": {"keyframes": {"type": "null"}}},
                },
                {
                    "if": {"required": ["mode"], "properties": {"mode": {"const": "ref2va"}}},
                    "then": present("references"),
                    "else": {"properties": {"references": {"type": "null"}}},
                },
                REFERENCE_IS_FIRST_FRAME,
                *EXCLUSIONS,
            ]
        }
    )

    model: str | None = None  # one of the deployment's models: the document lists them (H3_OPENAI_MODELS)
    size: str | None = Field(default=None, pattern=SIZE_PATTERN)
    seconds: str | None = Field(default=None, pattern=SECONDS_PATTERN)
    input_reference: FileReference | ImageUrlReference | None = None


class VideoError(BaseModel):  # noqa: D101
    code: str  # h3core's failure kind (oom, stalled, invalid, ...), or "cancelled"
    message: str


class Video(BaseModel):
    """The video object, field for field as OpenAI defines it."""

    id: str
    object: Literal["video"] = "video"
    model: str
    status: VideoStatus
    progress: int = Field(ge=0, le=100)
    created_at: int
    completed_at: int | None
    expires_at: int | None  # never set: no video expires here
    prompt: str
    size: str
    seconds: str
    remixed_from_video_id: str | None
    error: VideoError | None


class VideoList(BaseModel):  # noqa: D101
    object: Literal["list"] = "list"
    data: list[Video]
    first_id: str | None
    last_id: str | None
    has_more: bool


class VideoDeleted(BaseModel):  # noqa: D101
    id: str
    object: Literal["video.deleted"] = "video.deleted"
    deleted: bool
    # h3core's: what became of the video's file (DELETE /v1/videos/{id}'s description says each).
    file: Literal["removed", "recorded", "none"]


class Remix(BaseModel):  # noqa: D101
    model_config = ConfigDict(extra="forbid", strict=True)

    prompt: Prompt

    @model_validator(mode="before")
    @classmethod
    def _an_object(cls, data: object) -> object:
        return json_object(data, cls)


class ErrorDetail(BaseModel):  # noqa: D101
    message: str
    type: str
    param: str | None = None
    code: str | None = None
    ceiling: dict[str, Any] | None = None  # h3core's: the limit an admission refusal names


class ErrorResponse(BaseModel):  # noqa: D101
    error: ErrorDetail


class VideoApiError(Exception):
    """A failure to answer in OpenAI's shape: the status, and what `error` says."""

    def __init__(
        self,
        status: int,
        message: str,
        *,
        param: str | None = None,
        code: str | None = None,
        ceiling: dict[str, Any] | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.param = param
        self.code = code
        self.ceiling = ceiling
        self.headers = dict(headers or {})

    def body(self) -> dict[str, Any]:
        """The answer's body, in OpenAI's shape (`error_body`)."""
        return error_body(self.status, self.message, param=self.param, code=self.code, ceiling=self.ceiling)


def bad(param: str | None, message: str, code: str = "invalid_value") -> VideoApiError:
    """A 400 in OpenAI's shape about the parameter `param` (None: the request as a whole)."""
    return VideoApiError(400, message, param=param, code=code)


def error_body(
    status: int, message: str, *, param: str | None = None, code: str | None = None, ceiling: dict[str, Any] | None = None
) -> dict[str, Any]:
    """`{"error": {"message", "type", "param", "code"}}`, as OpenAI answers (and a ceiling if any)."""
    kind = "server_error" if status >= 500 else "invalid_request_error"
    error: dict[str, Any] = {"message": message, "type": kind, "param": param, "code": code}
    if ceiling is not None:
        error["ceiling"] = ceiling
    return {"error": error}


# -- the video object -------------------------------------------------------------------------


def video_status(state: JobState) -> VideoStatus:
    """OpenAI's status for the job's: queued, in_progress, completed, or failed (a cancelled job too)."""
    match state.status:
        case "submitted" | "queued":
            return "queued"
        case "running":
            return "in_progress"
        case "done":
            return "completed"
    return "failed"  # failed, and cancelled (with the error code "cancelled")


def progress(state: JobState) -> int:
    """0-100 from the whole job's steps (a long video's: every segment's); 100 only once the video
    is done (decoding, and joining the segments, follow the last step)."""
    if state.status == "done":
        return 100
    done = state.steps_done
    if done is None:
        return 0
    return min(99, done * 100 // state.steps_total)


def seconds_text(frames: int) -> str:
    """A frame count as OpenAI's `seconds` string at 24 fps: 96 -> "4", 22 -> "0.917"."""
    return f"{frames / FPS:.3f}".rstrip("0").rstrip(".")


def _unix(at: datetime | None) -> int | None:
    return None if at is None else int(at.timestamp())


def video_object(state: JobState, *, model: str) -> Video:
    """The video object for a job's state, its model named `model`; a failed or cancelled job's
    `error` says why."""
    error = None
    if state.status == "failed" and state.error is not None:
        error = VideoError(code=state.error.kind, message=state.error.message)
    elif state.status == "cancelled":
        error = VideoError(code="cancelled", message="the video was cancelled before it was finished")
    r = state.request
    return Video(
        id=state.job_id,
        model=model,
        status=video_status(state),
        progress=progress(state),
        created_at=int(state.created_at.timestamp()),
        completed_at=_unix(state.finished_at),
        expires_at=None,  # h3core keeps a video until it is deleted (then it is gone: 404)
        prompt=r.prompt,
        size=f"{r.width}x{r.height}",
        seconds=seconds_text(r.frames),
        remixed_from_video_id=state.remixed_from,
        error=error,
    )


def poll_after_ms(state: JobState, now: datetime) -> int | None:
    """How long a client should wait before asking again: about one step of the running attempt
    (its time so far over the steps it computed), within POLL_MS; None once the video has ended
    (nothing will change)."""
    if state.terminal:
        return None
    if not state.attempt_steps or state.attempt_started_at is None:
        return 1000
    per_step = (now - state.attempt_started_at).total_seconds() * 1000 / state.attempt_steps
    return int(min(max(per_step, POLL_MS[0]), POLL_MS[1]))


# -- create parameters ------------------------------------------------------------------------

_SIZE = re.compile(r"^\s*(\d{1,6})\s*[xX]\s*(\d{1,6})\s*$")


def parse_size(value: object) -> tuple[int, int]:
    """'WIDTHxHEIGHT' -> (width, height); sides the model cannot make are refused, naming the nearest."""
    m = _SIZE.match(value) if isinstance(value, str) else None
    if m is None:
        raise bad("size", f"size must be a string 'WIDTHxHEIGHT' (e.g. '1344x768'), not {value!r}")
    width, height = int(m.group(1)), int(m.group(2))
    why = sides_refusal((width, height))
    if why is not None:
        raise bad("size", f"size {value!r} cannot be made: {why}")
    return width, height


def frames_for(value: object) -> int:
    """OpenAI's `seconds` (a string such as "4", or a number) -> frames at 24 fps, rounded."""
    seconds = None
    if isinstance(value, (int, float, str)) and not isinstance(value, bool):
        try:
            seconds = float(value.strip() if isinstance(value, str) else value)
        except (ValueError, OverflowError):
            seconds = None
    if seconds is None or not math.isfinite(seconds * FPS) or seconds <= 0:
        raise bad("seconds", f"seconds must be a positive number of seconds such as '5', not {value!r}")
    frames = max(1, round(seconds * FPS))  # any positive length is at least one frame
    if frames > MAX_FRAMES:
        raise bad("seconds", f"seconds {value!r} is {frames} frames; a request has at most {MAX_FRAMES} ({MAX_FRAMES / FPS:g} s)")
    return frames


def check_model(value: object, served: Sequence[str]) -> None:
    """Refuse (400, `model_not_found`) a model that is not among `served`."""
    if value not in served:
        raise bad(
            "model", f"model {value!r} is not served here; this deployment serves: {', '.join(served)}", code="model_not_found"
        )


def request_fields(params: Mapping[str, object], *, served: Sequence[str], first_frame: str | None = None) -> dict[str, object]:
    """The fields of h3core's request for a create call: OpenAI's parameters mapped, every other
    one passed through (h3core's own fields, as `extra_body` sends them). `first_frame`: the
    upload the `input_reference` became. Giving an OpenAI parameter and the h3core field it
    sets is refused, naming both."""
    given = {k: v for k, v in params.items() if k not in OPENAI_FIELDS or v is not None}
    out = {k: v for k, v in given.items() if k not in OPENAI_FIELDS}
    if "prompt" in given:
        out["prompt"] = given["prompt"]
    if "model" in given:
        check_model(given["model"], served)
    for openai_name, own in (("size", ("width", "height")), ("seconds", ("frames",))):
        clash = [f for f in own if f in out]
        if openai_name in given and clash:
            raise bad(openai_name, f"give {openai_name} or {' and '.join(clash)}, not both")
    if "size" in given:
        out["width"], out["height"] = parse_size(given["size"])
    if "seconds" in given:
        out["frames"] = frames_for(given["seconds"])
    if first_frame is not None:
        if out.get("keyframes") is not None:
            raise bad("input_reference", "input_reference is the first keyframe: give it or keyframes, not both")
        if out.get("mode", "fl2va") != "fl2va":
            raise bad("input_reference", f"input_reference (the first frame) needs mode 'fl2va', not {out['mode']!r}")
        out["mode"] = "fl2va"
        out["keyframes"] = {"first": first_frame}
    return out


def param_for(loc: Sequence[object], params: Mapping[str, object]) -> str | None:
    """The create parameter a validation error of h3core's request points at."""
    head = str(loc[0]) if loc else None
    if head in ("width", "height") and params.get("size") is not None:
        return "size"
    if head == "frames" and params.get("seconds") is not None:
        return "seconds"
    if head in ("keyframes", "mode") and params.get("input_reference") is not None:
        return "input_reference"
    return ".".join(str(p) for p in loc) or None


_KEY = re.compile(r"^([^\[\]]+)((?:\[[^\[\]]*\])*)$")
_PART = re.compile(r"\[([^\[\]]*)\]")


def unflatten_form(items: Iterable[tuple[str, object]]) -> dict[str, object]:
    """Form fields as the SDK writes nested data (`keyframes[first]`, `references[images][]`,
    repeated for each item) back into dicts and lists; values stay as they came (strings, files)."""
    out: dict[str, object] = {}
    for key, value in items:
        m = _KEY.match(key)
        if m is None:
            raise bad(key, f"form field name {key!r} is not 'name' or 'name[part]...'")
        path = [m.group(1), *_PART.findall(m.group(2))]
        node: Any = out
        for i, part in enumerate(path):
            last = i == len(path) - 1
            if isinstance(node, list):
                if part != "":
                    raise bad(key, f"form field {key!r} mixes a list and named parts")
                if last:
                    node.append(value)
                    break
                node.append({} if path[i + 1] != "" else [])
                node = node[-1]
                continue
            if part == "":
                raise bad(key, f"form field {key!r} mixes a list and named parts")
            if last:
                if part in node:
                    raise bad(key, f"form field {key!r} is given more than once")
                node[part] = value
                break
            want: Any = [] if path[i + 1] == "" else {}
            child = node.setdefault(part, want)
            if type(child) is not type(want):
                raise bad(key, f"form field {key!r} is both a value and a group")
            node = child
    return out
