"""Prometheus metrics: jobs by status and queue depth read from the store at scrape time;
job durations and executor failures counted from the live event stream."""

from __future__ import annotations

import logging
from datetime import datetime

import anyio
from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.exposition import generate_latest

from h3core.adapters.store.base import EventStore
from h3core.adapters.store.nodes import NodeLeases, WithNodeLeases
from h3core.domain.events import (
    AttemptFailed,
    Checkpointed,
    CheckpointRejected,
    Done,
    Event,
    Failed,
    Progress,
    Released,
    Restored,
    Running,
    SegmentDone,
)
from h3core.domain.state import TERMINAL
from h3core.executors.base import Executor
from h3core.runtime.bus import EventBus
from h3core.runtime.delivery_process import DeliveryProcess
from h3core.runtime.store_retry import transient

log = logging.getLogger("h3core.metrics")

# Jobs take minutes (docs/design.md §1: 11–14 min); the buckets span a fake second to an hour.
GROUP_STATES = ("starting", "ready", "busy", "dead", "down")
DURATION_BUCKETS = (1, 5, 15, 30, 60, 120, 300, 600, 900, 1200, 1800, 3600)


class _StoreCollector:
    def __init__(self, store: EventStore) -> None:
        self.store = store

    def collect(self):
        counts = self.store.counts()
        jobs = GaugeMetricFamily("h3core_jobs", "Jobs by status.", labels=["status"])
        for status in ("queued", "running", "done", "failed", "cancelled"):
            n = counts.get(status, 0) + (counts.get("submitted", 0) if status == "queued" else 0)
            jobs.add_metric([status], n)
        yield jobs
        yield GaugeMetricFamily(
            "h3core_queue_depth", "Jobs waiting for a slot.", value=counts.get("queued", 0) + counts.get("submitted", 0)
        )


class _NodeCollector:
    """The runner nodes of a store shared by several (PostgreSQL): each one's liveness, slots,
    attempts leased, heartbeat age (by the store's clock) and whether it is draining."""

    def __init__(self, leases: NodeLeases) -> None:
        self.leases = leases

    def collect(self):
        up = GaugeMetricFamily("h3core_node_up", "1 while the runner node beats within its lease.", labels=["node"])
        slots = GaugeMetricFamily("h3core_node_slots", "Attempts the runner node runs at once.", labels=["node"])
        leases = GaugeMetricFamily("h3core_node_leases", "Attempts the runner node runs now (leases held).", labels=["node"])
        age = GaugeMetricFamily("h3core_node_beat_age_seconds", "Seconds since the node's last heartbeat.", labels=["node"])
        draining = GaugeMetricFamily(
            "h3core_node_draining", "1 while the runner node is marked draining: it takes no new jobs.", labels=["node"]
        )
        for n in self.leases.nodes():
            up.add_metric([n.node_id], 1 if n.alive() else 0)
            slots.add_metric([n.node_id], n.slots)
            leases.add_metric([n.node_id], n.leases)
            age.add_metric([n.node_id], n.beat_age_s)
            draining.add_metric([n.node_id], 0 if n.drain is None else 1)
        yield from (up, slots, leases, age, draining)


class _GroupCollector:
    """Device groups (an executor whose `health()` is not None): whether each is up, and how often
    it was rebuilt; whether the Ray head they run on is up, and how often it was lost."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def collect(self):
        groups = self.executor.health()
        if groups is None:
            return
        up = GaugeMetricFamily(
            "h3core_group_up", "1 when the device group can run a job (ready or busy).", labels=["group", "size"]
        )
        state = GaugeMetricFamily(
            "h3core_group_state", "The device group's state (1 for the current one).", labels=["group", "state"]
        )
        rebuilds = CounterMetricFamily("h3core_group_rebuilds", "Rebuilds of the device group after a failure.", labels=["group"])
        for h in groups:
            group = str(h.index)
            up.add_metric([group, str(h.size)], 1 if h.state in ("ready", "busy") else 0)
            for name in GROUP_STATES:
                state.add_metric([group, name], 1 if h.state == name else 0)
            rebuilds.add_metric([group], h.rebuilds)
        yield up
        yield state
        yield rebuilds
        head = self.executor.head()
        if head is None:
            return
        yield GaugeMetricFamily(
            "h3core_ray_head_up", "1 while the Ray head of the device groups answers.", value=1 if head.state == "up" else 0
        )
        yield CounterMetricFamily(
            "h3core_ray_head_losses", "Times the Ray head was lost (and Ray restarted or rejoined).", value=head.losses
        )


class _AttentionCollector:
    """The pipeline's start-up attention probe (an executor whose `attention_report()` is not None):
    the kernel that runs, and what each candidate measured."""

    def __init__(self, executor: Executor) -> None:
        self.executor = executor

    def collect(self):
        report = self.executor.attention_report()
        if report is None:
            return
        kernel = GaugeMetricFamily("h3core_attention_kernel", "1 for the attention kernel the pipeline runs.", labels=["kernel"])
        verdict = GaugeMetricFamily(
            "h3core_attention_probe_verdict",
            "The start-up probe's verdict on each kernel (1 for it).",
            labels=["kernel", "verdict"],
        )
        seconds = GaugeMetricFamily(
            "h3core_attention_probe_seconds", "One attention call at the probe's length, median.", labels=["kernel", "tokens"]
        )
        peak = GaugeMetricFamily("h3core_attention_probe_peak_bytes", "Allocator peak during that call.", labels=["kernel"])
        error = GaugeMetricFamily(
            "h3core_attention_probe_error", "Relative L1 error against the float32 reference.", labels=["kernel"]
        )
        for row in report:
            kernel.add_metric([row.kernel], 1 if row.verdict == "chosen" else 0)
            verdict.add_metric([row.kernel, row.verdict], 1)
            if row.ms is not None:
                seconds.add_metric([row.kernel, str(row.tokens)], row.ms / 1000)
            if row.peak_bytes is not None:
                peak.add_metric([row.kernel], row.peak_bytes)
            if row.error is not None:
                error.add_metric([row.kernel], row.error)
        yield from (kernel, verdict, seconds, peak, error)


class _WebhookCollector:
    """Webhook deliveries by outcome: delivered, failed (a try), retried, given_up, superseded (a
    progress); and whether this process's delivery runs now (on a shared store one node's does)."""

    def __init__(self, delivery: DeliveryProcess) -> None:
        self.delivery = delivery

    def collect(self):
        family = CounterMetricFamily("h3core_webhook_deliveries", "Webhook sends by outcome.", labels=["outcome"])
        for outcome in ("delivered", "failed", "retried", "given_up", "superseded"):
            family.add_metric([outcome], self.delivery.outcomes.get(outcome, 0))
        yield family
        yield GaugeMetricFamily(
            "h3core_webhook_delivering",
            "1 while this node's process delivers the webhooks (on a shared store, one node's at a time).",
            value=1.0 if self.delivery.delivering else 0.0,
        )


class Metrics:
    """The service's Prometheus registry: jobs by status, runner nodes, device groups and the attention
    probe, read at scrape time; job durations and executor failures, counted by `follow`."""

    def __init__(self, store: EventStore, executor: Executor | None = None) -> None:
        self.registry = CollectorRegistry()
        self.registry.register(_StoreCollector(store))
        if isinstance(store, WithNodeLeases):
            self.registry.register(_NodeCollector(store.leases))
        if executor is not None:  # each reports only what the executor has (its reports are not None)
            self.registry.register(_GroupCollector(executor))
            self.registry.register(_AttentionCollector(executor))
        self.duration = Histogram(
            "h3core_job_duration_seconds",
            "From first start to the end, for jobs that ended.",
            ["status"],
            buckets=DURATION_BUCKETS,
            registry=self.registry,
        )
        self.failures = Counter(
            "h3core_executor_failures", "Failed attempts by kind (retried or not).", ["kind"], registry=self.registry
        )
        self.checkpoints = Counter(
            "h3core_checkpoints_written", "Denoising checkpoints stored and logged.", registry=self.registry
        )
        self.checkpoint_bytes = Counter(
            "h3core_checkpoint_bytes_written", "Bytes of the denoising checkpoints stored.", registry=self.registry
        )
        self.checkpoint_pause = Histogram(
            "h3core_checkpoint_pause_seconds",
            "How long the denoising loop waited for a checkpoint (its copy off the device).",
            buckets=(0.001, 0.01, 0.05, 0.1, 0.5, 1, 5, 30),
            registry=self.registry,
        )
        self.resumes = Counter("h3core_resumes", "Attempts that continued from a checkpoint.", registry=self.registry)
        self.rejected = Counter(
            "h3core_checkpoints_rejected",
            "Checkpoints found unusable (missing, truncated, wrong sha256).",
            registry=self.registry,
        )
        self.released = Counter(
            "h3core_attempts_released", "Attempts h3core's own graceful stop handed back (not failures).", registry=self.registry
        )
        self.redone = Counter(
            "h3core_steps_redone",
            "Denoising steps a later attempt computed again: those past its checkpoint (all, without one).",
            registry=self.registry,
        )
        self.steps_computed = Counter(
            "h3core_transformer_steps_computed",
            "Transformer steps computed in full by jobs that ended done, by quality level.",
            ["quality"],
            registry=self.registry,
        )
        self.steps_cached = Counter(
            "h3core_transformer_steps_cached",
            "Transformer steps served from the step cache by jobs that ended done, by quality level.",
            ["quality"],
            registry=self.registry,
        )
        self.store = store

    def watch_webhooks(self, delivery: DeliveryProcess) -> None:
        """Report the delivering process's counts and whether it delivers now."""
        self.registry.register(_WebhookCollector(delivery))

    def render(self) -> bytes:
        """The metrics in Prometheus's text format, for /metrics. It reads the store: call it on a
        worker thread."""
        return generate_latest(self.registry)

    async def follow(self, bus: EventBus) -> None:
        """Count from the live events until cancelled (resubscribing if ever dropped)."""
        while True:
            # First starts seen on this subscription: a job's duration then needs no store read.
            # Cleared when the subscription is dropped, since the ends it missed would leave
            # entries behind.
            started: dict[str, datetime] = {}
            reached: dict[str, int] = {}  # each running job's last step seen, across its attempts
            redo: dict[str, int] = {}  # a later attempt's steps to compute again, until it shows where it starts
            async with bus.subscribe() as events:
                async for event in events:
                    self._count_checkpoints(event, reached, redo)
                    if event.type == "running":
                        started.setdefault(event.job_id, event.at)
                    if isinstance(event.body, Done) and event.body.steps is not None:
                        counts = event.body.steps
                        self.steps_computed.labels(quality=counts.quality).inc(counts.computed)
                        self.steps_cached.labels(quality=counts.quality).inc(counts.cached)
                    if isinstance(event.body, Failed | AttemptFailed):
                        self.failures.labels(kind=event.body.kind).inc()
                    if event.type in TERMINAL:
                        reached.pop(event.job_id, None)
                        redo.pop(event.job_id, None)
                        first = started.pop(event.job_id, None)
                        if first is None:  # started before this subscription (or never)
                            first = await self._started_at(event.job_id)
                        if first is not None:
                            self.duration.labels(status=event.type).observe((event.at - first).total_seconds())

    async def _started_at(self, job_id: str) -> datetime | None:
        """When the job first started, from the store; None where it never did, or the store is away
        (that job's duration goes unobserved: a histogram is not worth stopping the process for)."""
        try:
            state = await anyio.to_thread.run_sync(self.store.get, job_id)
        except Exception as exc:
            if not transient(exc):
                raise
            log.warning("metrics: job %s's duration not observed: the store failed (%s)", job_id, exc, extra={"job_id": job_id})
            return None
        return state.started_at if state is not None else None

    def _count_checkpoints(self, event: Event, reached: dict[str, int], redo: dict[str, int]) -> None:
        """Checkpoints, resumes, releases, and the steps a later attempt computes again (its
        predecessor's last step, less the step of the checkpoint it continues from)."""
        b, job = event.body, event.job_id
        match b:
            case Checkpointed():
                self.checkpoints.inc()
                self.checkpoint_bytes.inc(b.checkpoint.bytes)
                self.checkpoint_pause.observe(b.paused_s)
            case CheckpointRejected():
                self.rejected.inc()
            case Released():
                self.released.inc()
            case Running() if b.attempt > 1 and reached.get(job):
                redo[job] = reached[job]
            case Restored():
                self.resumes.inc()
                if job in redo:
                    redo[job] = max(0, redo[job] - b.checkpoint.step)
            case Progress():
                if job in redo:
                    self.redone.inc(redo.pop(job))
                reached[job] = b.step
            case SegmentDone():  # a long video's segment made is kept: no later attempt computes it again
                reached.pop(job, None)
