"""The console's queue: which jobs a filter picks, a page of them by the store's list cursors, and
what a row shows (progress, elapsed, an ETA from the steps measured so far). Progress is the whole
job's: a long video made as segments counts the steps of all of them, and says which it makes.
Pure but for the store reads in `page`."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, Protocol

from h3core.domain.state import JobState
from h3core.domain.story import dur, segment_words

__all__ = [
    "ENDED",
    "SINCE",
    "STATUS_CHOICES",
    "MODES",
    "Filter",
    "Page",
    "Row",
    "page",
    "row",
    "UnknownChoice",
    "expected_starts",
    "SORTS",
    "sort_rows",
]

ENDED = ("done", "failed", "cancelled")
# The status filter's choices: one status, or "ended" (done, failed and cancelled together).
STATUS_CHOICES = ("queued", "running", "done", "failed", "cancelled", "ended")
SINCE = {"1h": timedelta(hours=1), "24h": timedelta(days=1), "7d": timedelta(days=7)}
SCAN_BATCH = 200
# Rows one page request reads at most while looking for matches of a narrow filter: the page then
# ends early with a cursor to go on from, so that no filter makes one request read the whole store.
SCAN_BUDGET = 5000


MODES = ("t2va", "fl2va", "ref2va")


class UnknownChoice(ValueError):
    """A filter's query parameter that is none of its choices."""

    def __init__(self, name: str, given: str, choices: Sequence[str]) -> None:
        super().__init__(f"{name} {given!r} is not one of: {', '.join(choices)}")
        self.name, self.given, self.choices = name, given, tuple(choices)


class JobLister(Protocol):
    def list_jobs(
        self, *, status=None, limit: int = 50, before: int | None = None, after: int | None = None, oldest_first: bool = False
    ) -> list[tuple[int, JobState]]: ...


@dataclass(frozen=True)
class Filter:
    """What the queue page's filter form asks for; every field optional."""

    status: str | None = None  # one of STATUS_CHOICES
    mode: str | None = None
    text: str = ""  # in the prompt or the job id
    since: str | None = None  # a key of SINCE: created within that long
    sort: str | None = None  # a key of SORTS: the rows of a page in that order (else as listed)

    @classmethod
    def of(cls, status: str | None, mode: str | None, text: str | None, since: str | None, sort: str | None = None) -> Filter:
        """From the form's query parameters (an empty one: any). Raises `UnknownChoice` naming the
        parameter and its choices for a value that is none of them: a page that silently showed
        everything for `?status=bogus` would look like an answer."""
        choices = (
            ("status", status, STATUS_CHOICES),
            ("mode", mode, MODES),
            ("since", since, tuple(SINCE)),
            ("sort", sort, tuple(SORTS)),
        )
        for name, given, allowed in choices:
            if given and given not in allowed:
                raise UnknownChoice(name, given, allowed)
        text = (text or "").strip()[:200]
        return cls(status=status or None, mode=mode or None, text=text, since=since or None, sort=sort or None)

    @property
    def store_status(self) -> str | None:
        """The status the store can select on (its index), when the filter names exactly one."""
        return self.status if self.status in ("queued", "running", "done", "failed", "cancelled") else None

    @property
    def needs_scan(self) -> bool:
        """Whether rows must be read and judged here: the store selects on one status only."""
        return bool(self.mode or self.text or self.since or (self.status and not self.store_status))

    def statuses(self) -> tuple[str, ...] | None:
        """The job statuses the filter keeps, None for any: `queued` takes the jobs still `submitted`
        too, and `ended` is done, failed and cancelled."""
        if self.status == "ended":
            return ENDED
        if self.status == "queued":
            return ("submitted", "queued")
        return (self.status,) if self.status else None

    def matches(self, state: JobState, now: datetime) -> bool:
        """Whether the job passes every part of the filter at `now`: status, mode, text (in the prompt or
        the id, any part of either) and the `since` window."""
        wanted = self.statuses()
        if wanted is not None and state.status not in wanted:
            return False
        if self.mode is not None and state.request.mode != self.mode:
            return False
        if self.text:
            needle = self.text.lower()
            if needle not in state.job_id.lower() and needle not in state.request.prompt.lower():
                return False
        return self.since is None or state.created_at >= now - SINCE[self.since]

    def too_old(self, state: JobState, now: datetime) -> bool:
        """Past the `since` window; the list is in submission order, so every later row is too."""
        return self.since is not None and state.created_at < now - SINCE[self.since]

    def query(self) -> dict[str, str]:
        """The filter as query parameters (for the pager's links)."""
        out = {"status": self.status, "mode": self.mode, "q": self.text, "since": self.since, "sort": self.sort}
        return {k: v for k, v in out.items() if v}


@dataclass
class Page:
    """A page of matching jobs, newest first, and cursors to the newer (`after`) and older (`before`) ones."""

    jobs: list[JobState] = field(default_factory=list)
    newer: int | None = None
    older: int | None = None
    scanned: int = 0
    cut_short: bool = False  # the scan budget ran out before the page was full


def page(
    store: JobLister,
    wanted: Filter,
    now: datetime,
    *,
    limit: int = 50,
    before: int | None = None,
    after: int | None = None,
    budget: int = SCAN_BUDGET,
) -> Page:
    """Up to `limit` jobs matching `wanted`, newest first: older than cursor `before`, or newer than
    cursor `after` (the store's `queue_order`); at most `budget` rows read."""
    backwards = after is not None and before is None
    # A filter the store's index answers alone reads one row past the page; others read batches
    # from that size up, doubling: most pages fill from the first (every row is read and parsed).
    size = limit + 1
    found: list[tuple[int, JobState]] = []
    cursor = after if backwards else before
    scanned, cut_short = 0, False
    while True:
        if scanned >= budget:
            cut_short = True
            break
        asked = min(size, budget - scanned)
        if backwards:
            batch = store.list_jobs(status=wanted.store_status, limit=asked, after=cursor, oldest_first=True)
        else:
            batch = store.list_jobs(status=wanted.store_status, limit=asked, before=cursor)
        scanned += len(batch)
        past_window = False
        for order, state in batch:
            if not backwards and wanted.too_old(state, now):
                past_window = True
                break
            cursor = order
            if wanted.matches(state, now):
                found.append((order, state))
                if len(found) > limit:
                    break
        if past_window or len(found) > limit or len(batch) < asked:
            break
        size = min(size * 2, SCAN_BATCH) if wanted.needs_scan else size
    more = len(found) > limit or cut_short
    found = found[:limit]
    if backwards:
        found.reverse()
    result = Page(jobs=[s for _, s in found], scanned=scanned, cut_short=cut_short)
    newest, oldest = (found[0][0], found[-1][0]) if found else (cursor, cursor)
    if backwards:
        result.newer = newest if more else None
        result.older = oldest if found else after
    else:
        result.newer = newest if before is not None and found else before
        result.older = oldest if more and found else (cursor if cut_short else None)
    return result


Phase = Literal["queued", "running", "done", "failed", "cancelled"]


@dataclass(frozen=True)
class Row:
    """One job as a queue row shows it."""

    id: str
    status: Phase
    mode: str
    size: str
    frames: int
    prompt: str
    created: datetime
    step: int | None  # the whole job's steps done (every segment's, for a video made as segments)
    total: int
    percent: int
    elapsed: str
    elapsed_s: float
    eta: str | None  # None: nothing measured yet to base one on
    error_kind: str | None
    cancel_requested: bool
    attempt: int
    priority: int = 0
    position: int | None = None  # queued: 1 for the next to start
    expected_start: str | None = None  # queued: an estimate ("in 4m10s"), None where none can be made
    segments: str | None = None  # a video made as segments: "segment 2 of 3" (`_segments`)

    @property
    def time_label(self) -> str:
        """What the time column's figure is for this row: the wait so far, the run so far, or the
        whole time from its first start to its end."""
        return {"queued": "waiting", "running": "running"}.get(self.status, "took")

    @property
    def cancellable(self) -> bool:
        """Whether the row offers a cancel: the job is queued or running and no cancel was asked."""
        return self.status in ("queued", "running") and not self.cancel_requested

    @property
    def ended(self) -> bool:
        """Whether the job has ended: done, failed or cancelled."""
        return self.status in ENDED


def eta_seconds(state: JobState) -> float | None:
    """Seconds left at the pace measured so far in this attempt: the time from its start to its last
    event, per step it computed itself (not those of segments earlier attempts made, nor those of a
    checkpoint it continued from), times the whole job's steps left (every segment still to make).
    None before its first step (no pace yet)."""
    done = state.attempt_steps
    if not done or state.attempt_started_at is None:
        return None
    spent = (state.updated_at - state.attempt_started_at).total_seconds()
    if spent <= 0:
        return None
    return spent / done * max(state.steps_total - (state.steps_done or 0), 0)


def row(state: JobState, now: datetime, position: int | None = None, expected_start: float | None = None) -> Row:
    """The job as its queue row shows it at `now`: a `submitted` job as queued, a done one at its last
    step, its elapsed time from its first start (or, not started, from its submission), and the ETA
    `eta_seconds` gives; steps are the whole job's, and a video made as segments says which."""
    status: Phase = "queued" if state.status == "submitted" else state.status
    total = state.steps_total
    step = total if status == "done" else state.steps_done
    start = state.started_at
    elapsed = ((state.finished_at or now) - start).total_seconds() if start else (now - state.created_at).total_seconds()
    eta = eta_seconds(state)
    r = state.request
    return Row(
        id=state.job_id,
        status=status,
        mode=r.mode,
        size=f"{r.width}x{r.height}",
        frames=r.frames,
        prompt=r.prompt,
        created=state.created_at,
        step=step,
        total=total,
        percent=int(100 * (step or 0) / total) if total else 0,
        elapsed=dur(max(elapsed, 0.0)),
        elapsed_s=max(elapsed, 0.0),
        eta=dur(eta) if eta is not None else None,
        error_kind=state.error.kind if state.error else None,
        cancel_requested=state.cancel_requested,
        attempt=state.attempt,
        priority=state.priority,
        position=position,
        expected_start=(("now" if expected_start <= 0 else f"in {dur(expected_start)}") if expected_start is not None else None),
        segments=_segments(state, status),
    )


def _segments(state: JobState, status: Phase) -> str | None:
    """What a row says of a video made as segments: how many in all, before any is made and once it is
    done; which is being made (or next); how many were made, where it failed or was cancelled."""
    if state.plan is None:
        return None
    count, made = len(state.plan.segments), len(state.segments)
    if status == "done" or (status == "queued" and not made):
        return f"{count} segments"
    if status in ENDED:
        return f"{made} of {count} segments made"
    return segment_words(made, count)


def rows(states: Iterable[JobState], now: datetime) -> list[Row]:
    return [row(s, now) for s in states]


# How a page's rows may be sorted (`?sort=`): by its column, most urgent or latest first.
SORTS: dict[str, Callable[[Row], Any]] = {
    "priority": lambda r: (-r.priority, r.created),
    "status": lambda r: (ENDED.index(r.status) if r.status in ENDED else -1, r.status),
    "submitted": lambda r: r.created,
    "time": lambda r: -r.elapsed_s,
}


def sort_rows(rows: list[Row], key: str | None) -> list[Row]:
    """A page's rows in the order `key` (of SORTS) asks for; as listed (newest first) without one."""
    return sorted(rows, key=SORTS[key]) if key else rows


def pace(running: Iterable[JobState]) -> float | None:
    """Seconds per step of the running attempts so far, over the steps each computed itself (the
    median: one stalled job does not set it); None before any has reported a step."""
    paces = sorted(
        (s.updated_at - s.attempt_started_at).total_seconds() / s.attempt_steps
        for s in running
        if s.attempt_steps and s.attempt_started_at is not None
    )
    return paces[len(paces) // 2] if paces else None


def expected_starts(queued: Sequence[JobState], running: Sequence[JobState], slots: int) -> list[float | None]:
    """Seconds from now until each of `queued` (in the order they will start) is expected to start,
    with `slots` jobs at once: each slot frees when its running job's ETA says, then runs the queued
    jobs in turn for the steps each has left (a long video's, of every segment not yet made) at the
    measured pace. None for all where no pace is measured yet,
    and for a job whose turn needs a running job's ETA that is unknown."""
    per_step = pace(running)
    if per_step is None or slots < 1:
        return [None] * len(queued)
    free: list[float | None] = [eta_seconds(s) for s in running if s.status == "running"][:slots]
    free += [0.0] * (slots - len(free))
    out: list[float | None] = []
    for state in queued:
        known = [t for t in free if t is not None]
        if not known:
            out.append(None)
            continue
        start = min(known)
        free.remove(start)
        out.append(start)
        free.append(start + per_step * (state.steps_total - (state.steps_done or 0)))
    return out
