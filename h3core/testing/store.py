"""The event-store contract as tests, for any implementation of `h3core.EventStore`.

Subclass `EventStoreContract` in a test module and override its `store` fixture to give a
fresh, empty store; pytest then runs every contract test against it:

    class TestMyStore(EventStoreContract):
        @pytest.fixture
        def store(self, tmp_path):
            s = MyStore(tmp_path / "db")
            yield s
            s.close()

h3core's own suite runs it against `SQLiteEventStore` and `MemoryEventStore`. Needs pytest.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from h3core.adapters.store.base import Conflict, EventLog, EventStore, JobProjections, UnknownJob
from h3core.domain.admission import QueueFilter
from h3core.domain.events import Admitted, AttemptFailed, Progress, Reprioritized, Running, event_at, event_from_json
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent
from h3core.domain.webhooks import Delivery
from h3core.testing.factories import done_log, submitted

__all__ = ["EventStoreContract"]

_AT = datetime(2026, 12, 1, tzinfo=UTC)


def _queue(store, job, priority=0, **kw):
    body = submitted(**kw).model_copy(update={"priority": priority})
    return store.append(job, [body, Admitted()])[0]


class EventStoreContract:
    """What every event store must do (the contract in `h3core.adapters.store.base`)."""

    @pytest.fixture
    def store(self):
        raise NotImplementedError("override the `store` fixture: yield a fresh, empty store")

    def test_it_is_both_a_log_and_its_projections(self, store):
        assert isinstance(store, EventLog) and isinstance(store, JobProjections) and isinstance(store, EventStore)

    def test_an_unknown_job_has_no_state_and_no_events(self, store):
        assert store.get("nope") is None and store.events("nope") == [] and store.queue_position("nope") is None
        assert store.job_ids() == [] and store.cursor() == 0 and store.counts() == {}

    def test_append_assigns_seq_and_returns_the_new_state(self, store):
        state, events = store.append("j", [submitted(), Admitted()])
        assert [e.seq for e in events] == [1, 2]
        assert state.status == "queued" and store.get("j") == state
        assert store.events("j", after_seq=1) == [events[1]]

    def test_an_illegal_batch_stores_nothing(self, store):
        store.append("j", [submitted(), Admitted()])
        with pytest.raises(IllegalEvent) as err:
            store.append("j", [Running(attempt=1, executor="x"), Progress(step=2, total=1)])
        assert err.value.code == "step_over_total"
        assert [e.type for e in store.events("j")] == ["submitted", "admitted"]
        assert store.get("j").status == "queued"

    def test_expected_seq_is_the_optimistic_concurrency_check(self, store):
        store.append("j", [submitted()], expected_seq=0)
        with pytest.raises(Conflict):
            store.append("j", [submitted()], expected_seq=0)
        with pytest.raises(Conflict):
            store.append("j", [Admitted()], expected_seq=5)
        store.append("j", [Admitted()], expected_seq=1)

    def test_appending_to_an_unknown_job_is_refused(self, store):
        with pytest.raises(UnknownJob):
            store.append("nope", [Admitted()])

    def test_idempotency_keys_are_unique(self, store):
        a = submitted().model_copy(update={"idempotency_key": "k1"})
        store.append("a", [a])
        assert store.by_idempotency_key("k1").job_id == "a"
        with pytest.raises(Conflict):
            store.append("b", [a])
        assert store.get("b") is None

    def test_queue_order_is_priority_then_fifo_and_a_retry_keeps_its_place(self, store):
        for job, prio in [("a", 0), ("b", 0), ("c", 5), ("d", 0)]:
            _queue(store, job, prio, retry=RetryPolicy(max_attempts=2))
        store.append("a", [Running(attempt=1, executor="x")])
        assert [s.job_id for s in store.queued()] == ["c", "b", "d"]
        assert [store.queue_position(j) for j in "abcd"] == [None, 2, 1, 3]
        store.append("a", [AttemptFailed(kind="interrupted", message="m", attempt=1)])
        assert [s.job_id for s in store.queued()] == ["c", "a", "b", "d"]
        assert [store.queue_position(j) for j in "cabd"] == [1, 2, 3, 4]  # a position is the place in that order
        assert [s.job_id for s in store.queued(2, exclude={"a", "c"})] == ["b", "d"]
        assert [s.job_id for s in store.queued(1, exclude=["zz"])] == ["c"]
        assert [s.job_id for s in store.unfinished()] == ["c", "a", "b", "d"]

    def test_a_reprioritized_job_moves_in_the_queue(self, store):
        for job, prio in [("a", 0), ("b", 0), ("c", 5)]:
            _queue(store, job, prio)
        store.append("b", [Reprioritized(priority=9, by="alice")])
        assert [s.job_id for s in store.queued()] == ["b", "c", "a"]
        assert [store.queue_position(j) for j in "abc"] == [3, 1, 2]
        assert store.get("b").priority == 9
        store.append("b", [Reprioritized(priority=-1)])
        assert [s.job_id for s in store.queued()] == ["c", "a", "b"]
        store.append("c", [Running(attempt=1, executor="x")])
        with pytest.raises(IllegalEvent):  # a job that has started keeps its place
            store.append("c", [Reprioritized(priority=50)])

    def test_queued_applies_a_nodes_pre_filter_on_frames_and_stored_tokens(self, store):
        # (job, frames, tokens stored at admission; None: none computed)
        jobs = [("a", 5, 900), ("b", 121, 5000), ("c", 241, None), ("d", 60, 20_000), ("e", 30, 3000)]
        for job, frames, tokens in jobs:
            store.append(job, [submitted(frames=frames), Admitted(tokens=tokens)])
        ids = lambda **kw: [s.job_id for s in store.queued(**kw)]  # noqa: E731
        assert ids(fits=QueueFilter()) == ["a", "b", "c", "d", "e"]
        assert ids(fits=QueueFilter(min_frames=30, max_frames=121)) == ["b", "d", "e"]  # both ends included
        assert ids(fits=QueueFilter(max_tokens=5000)) == ["a", "b", "c", "e"]  # a job with no count passes
        assert ids(fits=QueueFilter(min_frames=6, max_frames=200, max_tokens=4999)) == ["e"]
        assert ids(limit=1, exclude={"e"}, modes=["t2va"], fits=QueueFilter(min_frames=6)) == ["b"]
        assert ids(modes=["fl2va"], fits=QueueFilter()) == []
        for job, frames, tokens in jobs:  # the store's SQL and the filter's own test agree
            assert QueueFilter(min_frames=6, max_frames=200, max_tokens=4999).passes(frames, tokens) == (job == "e")

    def test_listing_is_newest_first_with_a_cursor_and_a_status_filter(self, store):
        for i in range(5):
            _queue(store, f"j{i}")
        store.append("j1", [Running(attempt=1, executor="x")])
        page = store.list_jobs(limit=2)
        assert [s.job_id for _, s in page] == ["j4", "j3"]
        page2 = store.list_jobs(limit=10, before=page[-1][0])
        assert [s.job_id for _, s in page2] == ["j2", "j1", "j0"]
        assert [s.job_id for _, s in store.list_jobs(status="running")] == ["j1"]
        assert store.counts() == {"queued": 4, "running": 1}
        assert store.job_ids() == [f"j{i}" for i in range(5)]

    def test_listing_pages_both_ways_from_a_jobs_cursor(self, store):
        for i in range(5):
            _queue(store, f"j{i}")
        assert store.cursor_of("nope") is None
        at = store.cursor_of("j1")
        assert [s.job_id for _, s in store.list_jobs(oldest_first=True, after=at, limit=2)] == ["j2", "j3"]
        assert [s.job_id for _, s in store.list_jobs(oldest_first=True)] == [f"j{i}" for i in range(5)]
        assert [s.job_id for _, s in store.list_jobs(before=store.cursor_of("j3"), after=at)] == ["j2"]
        newest = store.list_jobs(before=store.cursor_of("j3"))
        assert [s.job_id for _, s in newest] == ["j2", "j1", "j0"] and newest[0][0] == store.cursor_of("j2")

    def test_list_videos_leaves_out_videos_marked_deleted_and_pages_across_them(self, store):
        for i in range(8):
            _queue(store, f"j{i}")
        for job in ("j1", "j2", "j3", "j6", "j7"):
            store.mark_video_deleted(job, _AT)
        ids = lambda rows: [s.job_id for _, s in rows]  # noqa: E731
        assert ids(store.list_videos()) == ["j5", "j4", "j0"]
        newest = store.list_videos(limit=1)
        assert ids(newest) == ["j5"] and newest[0][0] == store.cursor_of("j5")
        assert ids(store.list_videos(limit=2, before=newest[0][0])) == ["j4", "j0"]
        # A deleted video's cursor is still a place to page from.
        assert ids(store.list_videos(oldest_first=True, after=store.cursor_of("j1"), limit=1)) == ["j4"]
        assert ids(store.list_videos(oldest_first=True, after=store.cursor_of("j0"))) == ["j4", "j5"]
        assert ids(store.list_videos(before=store.cursor_of("j5"), after=store.cursor_of("j0"))) == ["j4"]
        assert len(store.list_jobs(limit=100)) == 8, "the jobs stay listed"

    def test_a_video_deleted_mark_keeps_its_first_time_through_later_events(self, store):
        _queue(store, "a")
        _queue(store, "b")
        assert store.video_deleted_at("a") is None and store.video_deleted_at("nope") is None
        store.mark_video_deleted("a", _AT)
        store.mark_video_deleted("a", datetime(2027, 1, 1, tzinfo=UTC))
        assert store.video_deleted_at("a") == _AT and store.video_deleted_at("b") is None
        store.append("a", [Running(attempt=1, executor="x")])  # the projection's row is written again
        store.append_batch([("a", [Progress(step=1, total=2)], None)])
        assert store.video_deleted_at("a") == _AT
        assert [s.job_id for _, s in store.list_videos()] == ["b"]
        with pytest.raises(UnknownJob):
            store.mark_video_deleted("nope", _AT)

    def test_deletions_follow_in_the_order_marked_each_job_once(self, store):
        for job in ("a", "b", "c", "d"):
            _queue(store, job)
        assert store.video_deletions() == []
        for job in ("c", "a", "c", "d"):  # a second mark of c changes nothing
            store.mark_video_deleted(job, _AT)
        follow = lambda **kw: [(d.position, d.job_id) for d in store.video_deletions(**kw)]  # noqa: E731
        assert follow() == [(1, "c"), (2, "a"), (3, "d")]
        assert follow(after=1) == [(2, "a"), (3, "d")]
        assert follow(after=1, limit=1) == [(2, "a")] and follow(after=3) == []
        store.append("a", done_log(steps=1)[2:])  # it runs on and ends with a video: the feed says so
        store.mark_video_deleted("b", _AT)
        assert follow(after=3) == [(4, "b")]
        (a,) = store.video_deletions(after=1, limit=1)
        state = store.get("a")
        assert (a.status, a.path) == ("done", state.artifact.path) and store.video_deletions()[0][2:] == ("queued", None)
        assert store.videos_deleted_at(["a", "b", "x", "a"]) == {"a": _AT, "b": _AT}
        assert store.videos_deleted_at([]) == {}

    def test_a_writable_store_answers_ping(self, store):
        store.ping()

    def test_all_events_walks_every_log_in_order_across_batches(self, store):
        for i in range(4):
            store.append(f"j{i}", done_log(steps=2))
        events = list(store.all_events(batch=3))
        assert len(events) == 4 * 6
        assert [(e.job_id, e.seq) for e in events] == [(f"j{i}", s) for i in range(4) for s in range(1, 7)]

    def test_a_batch_commits_each_append_or_returns_its_refusal_in_place(self, store):
        store.append("a", [submitted(), Admitted()])
        outcomes = store.append_batch(
            [
                ("a", [Running(attempt=1, executor="x")], 2),
                ("b", [submitted()], 0),
                ("a", [Progress(step=3, total=2)], None),  # illegal: refused, the others stand
                ("c", [Admitted()], None),  # unknown job
                ("b", [Admitted()], 5),  # stale expectation
                ("a", [Progress(step=1, total=2)], None),
            ]
        )
        kinds = [type(o).__name__ if isinstance(o, Exception) else o[0].status for o in outcomes]
        assert kinds == ["running", "submitted", "IllegalEvent", "UnknownJob", "Conflict", "running"]
        assert [e.type for e in store.events("a")] == ["submitted", "admitted", "running", "progress"]
        assert [e.type for e in store.events("b")] == ["submitted"]
        assert store.get("c") is None

    def test_events_after_follows_every_job_in_the_order_stored(self, store):
        assert store.cursor() == 0 and store.events_after(0) == []
        store.append("a", [submitted(), Admitted()])
        start = store.cursor()
        store.append("b", [submitted()])
        store.append("a", [Running(attempt=1, executor="x")])
        with pytest.raises(IllegalEvent):  # refused: leaves no position behind
            store.append("b", [Running(attempt=1, executor="x")])
        store.append_batch([("b", [Admitted()], None), ("a", [Progress(step=1, total=4)], None)])
        rows = store.events_after(start)
        assert [(e.job_id, e.type) for _, e in rows] == [
            ("b", "submitted"),
            ("a", "running"),
            ("b", "admitted"),
            ("a", "progress"),
        ]
        positions = [p for p, _ in rows]
        assert positions == sorted(positions) and positions[0] > start and store.cursor() == positions[-1]
        assert store.events_after(positions[1], limit=2) == rows[2:4]
        assert [e for _, e in rows if e.job_id == "a"] == store.events("a", after_seq=2)

    def test_a_saved_position_is_answered_until_the_next_save_of_its_name(self, store):
        assert store.position("billing") is None
        store.save_position("billing", 7)
        store.save_position("audit", 3)
        assert store.position("billing") == 7 and store.position("audit") == 3
        store.save_position("billing", 9)
        assert store.position("billing") == 9 and store.position("audit") == 3

    def test_delivery_records_are_kept_per_job_seq_and_url_the_latest_winning(self, store):
        def record(job, seq, url, outcome, tries):
            return Delivery(
                job_id=job,
                seq=seq,
                event_type="done",
                url=url,
                webhook_id=f"msg_{job}_{seq}",
                outcome=outcome,
                tries=tries,
                updated_at=_AT,
            )

        assert store.deliveries("a") == []
        store.save_deliveries([record("a", 6, "https://y", "trying", 1), record("a", 3, "https://x", "delivered", 1)])
        store.save_deliveries([record("a", 6, "https://y", "delivered", 2), record("b", 6, "https://y", "given_up", 9)])
        assert store.deliveries("a") == [record("a", 3, "https://x", "delivered", 1), record("a", 6, "https://y", "delivered", 2)]
        assert [r.outcome for r in store.deliveries("b")] == ["given_up"]

    def test_imported_events_fold_as_appended_ones_and_importing_again_adds_nothing(self, store):
        source = [event_at("j", i, _AT, body) for i, body in enumerate(done_log(steps=2), start=1)]
        assert store.import_events(source) == len(source)
        assert store.events("j") == source and store.get("j").status == "done"
        assert store.import_events(source) == 0
        with pytest.raises(Conflict):  # the same place in the log, another event
            store.import_events([event_at("j", 2, _AT, Admitted(tokens=9))])

    def test_an_exported_line_from_before_versions_imports_as_version_1(self, store):
        """Export files outlive the code that wrote them (docs/events.md): a body without `v`."""
        lines = [e.model_dump_json(exclude={"body": {"v"}}) for e in [_submitted_event()]]
        assert all('"v"' not in line for line in lines)
        assert store.import_events([event_from_json(line) for line in lines]) == 1
        assert store.import_events([_submitted_event()]) == 0  # the versioned one is the same event
        assert store.get("j").status == "submitted"


def _submitted_event():
    return event_at("j", 1, _AT, submitted())
