"""A job's life as bars on one time axis, drawn from its log: the waits in the queue, each attempt
with its progress (the whole job's, for a long video made as segments), kernel and device group, how
it ended, and the marks between (resumed after a restart, cancel asked, recovered, each segment
made). Pure: the events in, positions in percent out."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

from h3core.domain.events import (
    AttemptFailed,
    Cancelled,
    CancelRequested,
    Done,
    Event,
    Failed,
    Planned,
    Recovered,
    Reprioritized,
    Running,
    SegmentDone,
)
from h3core.domain.story import dur, fields, segment_words, tries, ts

__all__ = ["Bar", "EventRow", "Mark", "Timeline", "event_rows", "timeline"]

# What a Running event's `info` may say about where the attempt ran, by the executors' keys.
KERNEL_KEYS = ("kernel", "attention")
GROUP_KEYS = ("group", "groups", "device_group", "device")
# What an attempt's bar says of how it ended (no outcome yet: "running").
_OUTCOMES: dict[type, str] = {AttemptFailed: "retried", Failed: "failed", Done: "done", Cancelled: "cancelled"}


@dataclass(frozen=True)
class Bar:
    """A bar of the timeline: a wait in the queue or an attempt, placed in percent of the axis, with how
    it ended and, for an attempt, its progress and where it ran."""

    kind: str  # "queue" or "attempt"
    label: str
    left: float  # percent of the axis
    width: float
    outcome: str  # queue: "waited" / "waiting"; attempt: "running", "done", "retried", "failed", "cancelled"
    detail: str = ""  # the failure's kind and message, where it failed
    percent: int | None = None  # the whole job's progress at the attempt's end (or now)
    kernel: str | None = None
    group: str | None = None


@dataclass(frozen=True)
class Mark:
    """A moment between the bars (resumed, detached, cancel asked, recovered): its label, its place in
    percent of the axis, and its time."""

    label: str
    at: float  # percent of the axis
    when: str


@dataclass
class Timeline:
    """A job's timeline: the axis's start and span as text, its bars and its marks (all empty for a job
    with no events)."""

    start: str
    span: str
    bars: list[Bar] = field(default_factory=list)
    marks: list[Mark] = field(default_factory=list)


@dataclass(frozen=True)
class EventRow:
    """A line of the event table: what `h3core replay` prints for the event."""

    seq: int
    at: str
    delta: str
    type: str
    fields: str


# Events a running attempt writes over and over: a run of them is one row of the event table.
ROUTINE = ("progress", "checkpointed")


def event_rows(events: Sequence[Event]) -> list[EventRow]:
    """The event table's rows: each event with its time, the time since the one before, and its fields;
    a run of routine events (steps, checkpoints) is one row saying how many of each and the first and
    last step, so that a 300-step job's table is a screen, not 360 rows."""
    out: list[EventRow] = []
    run: list[Event] = []
    before_run: Event | None = None

    def row(e: Event, before: Event | None) -> EventRow:
        delta = "" if before is None else "+" + dur((e.at - before.at).total_seconds())
        return EventRow(e.seq, ts(e.at), delta, e.type, fields(e))

    def flush() -> None:
        if len(run) == 1:
            out.append(row(run[0], before_run))
        elif run:
            first = row(run[0], before_run)
            kinds = " · ".join(f"{t} ×{n}" for t in ROUTINE if (n := sum(e.type == t for e in run)))
            steps = [e for e in run if e.type == "progress"] or run
            span = dur((run[-1].at - run[0].at).total_seconds())
            detail = f"{fields(steps[0])} … {fields(steps[-1])} (over {span})"
            out.append(EventRow(first.seq, first.at, first.delta, kinds, detail))
        run.clear()

    previous: Event | None = None
    for e in events:
        if e.type in ROUTINE:
            if not run:
                before_run = previous
            run.append(e)
        else:
            flush()
            out.append(row(e, previous))
        previous = e
    flush()
    return out


def _first(info: dict[str, str], keys: Sequence[str]) -> str | None:
    return next((info[k] for k in keys if info.get(k)), None)


def timeline(events: Sequence[Event], now: datetime) -> Timeline:
    """The job's timeline from its events: a job that has ended spans its log, a live one runs to `now`."""
    if not events:
        return Timeline(start="", span="")
    t0 = events[0].at
    terminal = events[-1].terminal
    end = events[-1].at if terminal else max(now, events[-1].at)
    span = max((end - t0).total_seconds(), 1e-3)

    def pos(at: datetime) -> float:
        return round(100 * min(max((at - t0).total_seconds(), 0.0), span) / span, 2)

    def bar(kind: str, label: str, a: datetime, b: datetime, outcome: str, **kw) -> Bar:
        return Bar(kind, label, pos(a), max(round(pos(b) - pos(a), 2), 0.4), outcome, **kw)

    infos = {e.body.attempt: e.body.info for e in events if isinstance(e.body, Running)}
    planned = next((len(e.body.plan.segments) for e in events if isinstance(e.body, Planned)), None)
    line = Timeline(start=ts(t0), span=dur(span))
    waiting_since: datetime | None = t0
    for t in tries(events):
        if waiting_since is not None:
            line.bars.append(
                bar("queue", f"queued {dur((t.started - waiting_since).total_seconds())}", waiting_since, t.started, "waited")
            )
        info = infos.get(t.number, {})
        o = t.outcome
        outcome = _OUTCOMES.get(type(o), "running")
        detail = f"{o.kind}: {o.message}" if isinstance(o, AttemptFailed | Failed) else ""
        stop = t.ended or end
        done, total = t.steps_done, t.steps_total
        step = f" step {done}/{total}" if done is not None else ""
        if t.of is not None:
            step += f" ({segment_words(t.made, t.of)})"
        line.bars.append(
            bar(
                "attempt",
                f"attempt {t.number} on {t.executor} {outcome} after {dur((stop - t.started).total_seconds())}{step}",
                t.started,
                stop,
                outcome,
                detail=detail,
                percent=int(100 * (done or 0) / total) if total else (100 if outcome == "done" else 0),
                kernel=_first(info, KERNEL_KEYS),
                group=_first(info, GROUP_KEYS),
            )
        )
        waiting_since = t.ended if isinstance(o, AttemptFailed) else None
    if waiting_since is not None:  # queued still, or ended while queued
        last = events[-1]
        stop = last.at if terminal else end
        failed = last.body if isinstance(last.body, Failed) else None  # failed while queued (not_started, ...)
        outcome = "failed" if failed else ("waited" if terminal else "waiting")
        detail = f"{failed.kind}: {failed.message}" if failed else ""
        label = f"queued {dur((stop - waiting_since).total_seconds())}"
        line.bars.append(bar("queue", label, waiting_since, stop, outcome, detail=detail))
    for e in events:
        b = e.body
        mark = {
            "resumed": "resumed",
            "detached": "detached",
            "cancel_requested": "cancel asked",
            "recovered": "recovered",
            "restored": "continued from a checkpoint",
            "released": "handed back by h3core's stop",
            "checkpoint_rejected": "checkpoint unusable",
            "reprioritized": "priority changed",
            "planned": "planned",
            "segment_done": "segment done",
        }.get(e.type)
        if mark is None:
            continue
        if isinstance(b, Recovered):
            mark = f"recovered attempt {b.attempt}'s committed video"
        elif isinstance(b, CancelRequested) and b.reason:
            mark = f"cancel asked: {b.reason}" + (f" (by {b.by})" if b.by else "")
        elif isinstance(b, Reprioritized):
            mark = f"priority set to {b.priority}" + (f" by {b.by}" if b.by else "")
        elif isinstance(b, Planned):
            mark = f"planned as {b.plan.describe()}"
        elif isinstance(b, SegmentDone):
            mark = f"segment {b.index + 1} of {planned} made ({b.artifact.frames} frames)"
        line.marks.append(Mark(mark, pos(e.at), ts(e.at)))
    return line
