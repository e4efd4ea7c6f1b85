"""A job's story as its log tells it, in words: one line per event, its attempts, and why it ended
so. Pure functions of the events, shared by `h3core replay` and the console's job page."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime

from h3core.domain.events import (
    Admitted,
    AttemptFailed,
    Cancelled,
    CancelRequested,
    Checkpoint,
    Checkpointed,
    CheckpointRejected,
    Detached,
    Done,
    Event,
    Failed,
    Planned,
    Progress,
    Recovered,
    Released,
    Reprioritized,
    Restored,
    Resumed,
    Running,
    SegmentDone,
    Submitted,
)
from h3core.domain.segments import steps_done
from h3core.domain.state import JobState

__all__ = ["Try", "dur", "earlier", "fields", "progress", "segment_words", "short", "tries", "ts", "why"]


def ts(at: datetime) -> str:
    """`at` in UTC, to the millisecond ("2026-01-31 12:00:00.000Z")."""
    return at.astimezone(UTC).strftime("%Y-%m-%d %H:%M:%S.%f")[:-3] + "Z"


def dur(seconds: float) -> str:
    """`seconds` for a human, in at most two units ("4.20s", "41.0s", "3m07s", "2h05m", "3d04h")."""
    seconds = max(seconds, 0.0)
    if seconds < 10:
        return f"{seconds:.2f}s"
    if seconds < 60:
        return f"{seconds:.1f}s"
    m, s = divmod(int(round(seconds)), 60)
    if m < 60:
        return f"{m}m{s:02d}s"
    h, m = divmod(m, 60)
    if h < 48:
        return f"{h}h{m:02d}m"
    d, h = divmod(h, 24)
    return f"{d}d{h:02d}h"


def short(text: str, n: int = 80) -> str:
    """`text` on one line (its whitespace collapsed), cut to at most `n` characters with an ellipsis."""
    text = " ".join(text.split())
    return text if len(text) <= n else text[: n - 1] + "…"


def fields(event: Event) -> str:
    """The fields of an event worth a human's attention, as one line."""
    b = event.body
    match b:
        case Submitted():
            r = b.request
            parts = [
                f"{r.mode} {r.width}x{r.height} frames={r.frames} steps={r.steps} seed={r.seed}",
                f"priority={b.priority}",
                f"retry=max {b.retry.max_attempts} on {','.join(b.retry.retry_on) or 'nothing'}",
            ]
            if b.idempotency_key:
                parts.append(f"key={b.idempotency_key}")
            if b.remixed_from:
                parts.append(f"remix of {b.remixed_from}")
            if b.warnings:
                parts.append(f"{len(b.warnings)} warning(s)")
            parts.append(f"prompt={short(r.prompt, 60)!r}")
            return "  ".join(parts)
        case Admitted():
            return f"tokens={b.tokens}" if b.tokens is not None else ""
        case Running():
            parts = [f"attempt={b.attempt}", f"executor={b.executor}"]
            if b.executor_ref:
                parts.append(f"ref={b.executor_ref}")
            parts += [f"{k}={v}" for k, v in b.info.items()]
            return "  ".join(parts)
        case Resumed():
            return f"attempt={b.attempt}  ref={b.executor_ref}  after={dur(b.after_s)}"
        case Detached():
            return f"attempt={b.attempt}  ref={b.executor_ref}  (h3core stopped; the work runs on)"
        case Progress():
            return f"step {b.step}/{b.total}"
        case Done():
            a = b.artifact
            late = "  (the cancel came too late: the work had finished)" if b.cancel_too_late else ""
            return f"artifact={a.path}  bytes={a.bytes}  sha256={a.sha256}  frames={a.frames}  duration={a.duration_s:g}s{late}"
        case Recovered():
            return f"attempt={b.attempt}  artifact={b.artifact.path}  (committed before h3core stopped; size and sha256 checked)"
        case AttemptFailed():
            return f"attempt={b.attempt}  kind={b.kind}  message={b.message!r}" + (f"  detail={b.detail!r}" if b.detail else "")
        case Failed():
            return f"kind={b.kind}  message={b.message!r}" + (f"  detail={b.detail!r}" if b.detail else "")
        case CancelRequested() | Cancelled():
            return f"reason={b.reason!r}" + (f"  by={b.by}" if b.by else "")
        case Reprioritized():
            return f"priority={b.priority}" + (f"  by={b.by}" if b.by else "")
        case Planned():
            return b.plan.describe()
        case SegmentDone():
            a = b.artifact
            return f"segment {b.index + 1}  artifact={a.path}  bytes={a.bytes}  sha256={a.sha256}  frames={a.frames}"
        case Checkpointed():
            return f"{_checkpoint(b.checkpoint)}  paused={dur(b.paused_s)}  write={dur(b.write_s)}"
        case Restored():
            c = b.checkpoint
            return f"attempt={b.attempt}  continues after step {c.step}/{c.total}  ({_checkpoint(c)})"
        case CheckpointRejected():
            return f"attempt={b.attempt}  {_checkpoint(b.checkpoint)}  unusable: {b.reason}"
        case Released():
            at = f" after step {b.step}" if b.step is not None else ""
            return f"attempt={b.attempt}{at}  handed back by h3core's own stop ({b.reason}): not a failure, no attempt spent"
    return ""  # pragma: no cover


def segment_words(made: int, of: int) -> str:
    """Where a job of `of` segments is, `made` of them made: "segment 2 of 3" (the one being made),
    or "all 3 segments made" (joining them)."""
    return f"segment {made + 1} of {of}" if made < of else f"all {of} segments made"


def progress(state: JobState) -> str | None:
    """How far the whole job is, in words: "step 8/50", or for a job made as segments "segment 2 of
    3, step 58/150" (the steps of all its segments); None before its first step."""
    done = state.steps_done
    if done is None:
        return None
    at = f"step {done}/{state.steps_total}"
    if state.plan is None:
        return at
    return f"{segment_words(len(state.segments), len(state.plan.segments))}, {at}"


def _checkpoint(c: Checkpoint) -> str:
    return f"step {c.step}/{c.total} of attempt {c.attempt}  path={c.path}  bytes={c.bytes}  sha256={c.sha256}"


@dataclass
class Try:
    """One attempt as the log tells it."""

    number: int
    started: datetime
    executor: str
    step: int | None = None
    total: int | None = None
    ended: datetime | None = None
    outcome: AttemptFailed | Failed | Done | Cancelled | Released | None = None
    resumed: list[Resumed] = field(default_factory=list)  # re-attached after h3core restarts
    restored: int | None = None  # the step it continued from (a checkpoint), if it did
    # A job made as segments: how many the plan has, how many the job had made at the attempt's
    # last event (earlier attempts' included) and each one's steps; `step`/`total` are the segment's.
    of: int | None = None
    made: int = 0
    per: int = 0

    @property
    def steps_done(self) -> int | None:
        """The whole job's steps done at the attempt's last event (None: none)."""
        if self.of is None:
            return self.step
        return steps_done(self.per, self.made, self.step, self.total)

    @property
    def steps_total(self) -> int | None:
        """The whole job's steps (None: not segmented and no step reported)."""
        return self.total if self.of is None else self.of * self.per

    @property
    def resumes(self) -> str:
        """' (resumed after 2 restarts of h3core, unfollowed 41.0s)', or nothing."""
        if not self.resumed:
            return ""
        n = len(self.resumed)
        away = dur(sum(r.after_s for r in self.resumed))
        return f" (resumed after {n} restart{'s' if n != 1 else ''} of h3core, unfollowed {away})"

    @property
    def where(self) -> str:
        """How far the attempt got: "after step 3/10" (a job made as segments counts all of theirs:
        "after step 13/30 (segment 2 of 3)"), or "before its first step"."""
        done = self.steps_done
        if done is None:
            return "before its first step"
        if self.of is None:
            return f"after step {done}/{self.steps_total}"
        return f"after step {done}/{self.steps_total} ({segment_words(self.made, self.of)})"


def tries(events: Sequence[Event]) -> list[Try]:
    """The job's attempts, in order, as `events` tell them."""
    tries: list[Try] = []
    current: Try | None = None
    per, of, made = 0, None, 0
    for e in events:
        b = e.body
        if isinstance(b, Submitted):
            per = b.request.steps
        elif isinstance(b, Planned):
            of = len(b.plan.segments)
        elif isinstance(b, Running):
            current = Try(b.attempt, e.at, b.executor, of=of, made=made, per=per)
            tries.append(current)
        elif isinstance(b, Progress) and current is not None:
            current.step, current.total = b.step, b.total
        elif isinstance(b, SegmentDone):
            made += 1
            if current is not None:  # the next segment's steps are its own
                current.made, current.step, current.total = made, None, None
        elif isinstance(b, Resumed) and current is not None:
            current.resumed.append(b)
        elif isinstance(b, Restored) and current is not None:
            current.restored = b.checkpoint.step
        elif isinstance(b, AttemptFailed | Failed | Done | Cancelled | Released) and current is not None:
            current.ended, current.outcome = e.at, b
            current = None
    return tries


def earlier(tries: list[Try]) -> str:
    """'attempt 1 failed executor_lost after step 3/10 — lost the worker' for each retried attempt,
    and 'attempt 2 handed back by h3core's own stop (shutdown) after step 7/10' for each released one."""
    out = []
    for t in tries:
        if isinstance(t.outcome, AttemptFailed):
            out.append(f"attempt {t.number} failed {t.outcome.kind} {t.where} — {short(t.outcome.message, 200)}")
        elif isinstance(t.outcome, Released):
            out.append(f"attempt {t.number} handed back by h3core's own stop ({t.outcome.reason}) {t.where}")
    return "; ".join(out)


def why(state: JobState, events: Sequence[Event], now: datetime) -> str:
    """One paragraph: how the job came to be where it is."""
    attempts = tries(events)
    last = attempts[-1] if attempts else None
    before = earlier(attempts)
    since_submit = (state.updated_at - state.created_at).total_seconds()

    if state.status == "done":
        assert state.artifact is not None and last is not None and last.ended is not None
        n = state.attempt
        text = f"done after {n} attempt{'s' if n != 1 else ''}"
        if before:
            text += f"; {before}"
        if state.cancel_requested:
            text += "; a cancel was requested, but the work had finished before it could take effect, so its video was kept"
        if state.recovered is not None:
            text += (
                f". h3core stopped after attempt {n} had committed its video and before it recorded the job done; "
                "recovery found the video intact (size and sha256 as committed) and recorded it instead of running again"
            )
        text += (
            f". Attempt {n} ran {dur((last.ended - last.started).total_seconds())}{last.resumes}; "
            f"{dur(since_submit)} from submission to done. "
            f"Artifact {state.artifact.path} ({state.artifact.bytes} bytes, sha256 {state.artifact.sha256})."
        )
        return text

    if state.status == "failed":
        assert state.error is not None
        err = state.error
        detail = f" ({err.detail})" if err.detail else ""
        if last is not None and isinstance(last.outcome, Failed):
            text = f"failed: {err.kind} {last.where} on attempt {last.number} — {err.message}{detail}"
        else:
            text = f"failed: {err.kind} while queued, before attempt {state.attempt + 1} ran — {err.message}{detail}"
        if before:
            text += f". Earlier: {before}"
        policy = state.retry
        if state.cancel_requested:
            text += ". Not retried: a cancel had been requested"
        elif err.kind == "not_started":
            text += f". Not retried: {state.not_started + 1} attempts never started"
        elif err.kind not in policy.retry_on:
            text += f". Not retried: the job's policy retries only {', '.join(policy.retry_on) or 'nothing'}"
        elif state.spent >= policy.max_attempts:
            text += f". Not retried: attempt {state.attempt} was the last of {policy.max_attempts} allowed"
        return text + f". It ended {dur(since_submit)} after submission."

    if state.status == "cancelled":
        reason = next((e.body.reason for e in reversed(events) if isinstance(e.body, Cancelled)), "")
        if last is not None and isinstance(last.outcome, Cancelled):
            text = f"cancelled while running attempt {last.number} {last.where}"
        else:
            text = "cancelled while queued" if state.attempt == 0 else f"cancelled while queued for attempt {state.attempt + 1}"
        if reason:
            text += f": {reason}"
        if before:
            text += f". Earlier: {before}"
        return text + f". It ended {dur(since_submit)} after submission."

    idle = dur((now - state.updated_at).total_seconds())
    if state.status == "running":
        assert last is not None and state.attempt_started_at is not None
        at = progress(state)
        step = f"at {at}" if at is not None else "with no step reported yet"
        text = (
            f"still running: attempt {state.attempt} on {state.executor} since {ts(state.attempt_started_at)} "
            f"({dur((now - state.attempt_started_at).total_seconds())} ago), {step}; last event {idle} ago"
        )
        if last.resumed:
            text += f"; re-attached to {state.executor_ref} at {ts(state.resumed_at or last.started)}{last.resumes}"
        if state.cancel_requested:
            text += "; a cancel was requested and the executor has not confirmed it yet"
        if before:
            text += f". Earlier: {before}"
        return text + "."

    if state.status == "queued":
        waiting_since = state.updated_at if attempts else (state.admitted_at or state.updated_at)
        text = (
            f"still queued since {ts(waiting_since)} ({dur((now - waiting_since).total_seconds())} ago), "
            f"waiting for attempt {state.attempt + 1}"
        )
        if before:
            text += f" after {before}"
        return text + "."

    return (
        f"submitted at {ts(state.created_at)} ({dur((now - state.created_at).total_seconds())} ago) "
        "but not admitted yet; the next worker to start admits it."
    )
