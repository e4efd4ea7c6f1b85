"""h3core: run long GPU video-generation jobs so that none is ever stuck, lost or half-done."""

import logging

from h3core.adapters.artifacts import ArtifactStore, LocalArtifactStore
from h3core.adapters.store import (
    Conflict,
    EventLog,
    EventStore,
    JobProjections,
    MemoryEventStore,
    SchemaTooNew,
    SQLiteEventStore,
    UnknownJob,
)
from h3core.bus import EventBus
from h3core.contracts import LiveContract
from h3core.domain.admission import (
    AdmissionPolicy,
    Admit,
    AdmitAll,
    Ceiling,
    Contract,
    Decision,
    Refuse,
)
from h3core.domain.capabilities import Capabilities, FrameWindow, GroupBudget, ModeReadiness
from h3core.domain.events import (
    Admitted,
    Artifact,
    AttemptFailed,
    Body,
    Cancelled,
    CancelRequested,
    Done,
    Event,
    Failed,
    Progress,
    Recovered,
    Resumed,
    Running,
    Submitted,
)
from h3core.domain.failures import FAILURE_KINDS, FailureKind
from h3core.domain.request import GenerationRequest, Keyframes, References
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent, JobState, apply, fold
from h3core.domain.topology import GroupPlan, Topology, place
from h3core.domain.upcasting import NewerBody
from h3core.executors import (
    Executor,
    ExecutorFailure,
    FakeExecutor,
    FakeLimits,
    FakePlan,
    Heartbeat,
    JobSpec,
    Result,
    classify,
)
from h3core.jobs import JobCancelled, JobFailed, JobNotDone, Jobs
from h3core.runner import (
    IdempotencyMismatch,
    NotCancellable,
    Refused,
    Runner,
    RunnerConfig,
    ShuttingDown,
)
from h3core.store_retry import StoreUnavailable

__all__ = [
    "AdmissionPolicy",
    "Admit",
    "AdmitAll",
    "Admitted",
    "Artifact",
    "ArtifactStore",
    "AttemptFailed",
    "Body",
    "CancelRequested",
    "Cancelled",
    "Capabilities",
    "Ceiling",
    "Conflict",
    "Contract",
    "Decision",
    "Done",
    "Event",
    "EventBus",
    "EventLog",
    "EventStore",
    "Executor",
    "ExecutorFailure",
    "FAILURE_KINDS",
    "Failed",
    "FailureKind",
    "FakeExecutor",
    "FakeLimits",
    "FakePlan",
    "FrameWindow",
    "GenerationRequest",
    "GroupBudget",
    "GroupPlan",
    "Heartbeat",
    "IdempotencyMismatch",
    "IllegalEvent",
    "JobCancelled",
    "JobFailed",
    "JobNotDone",
    "JobProjections",
    "JobSpec",
    "JobState",
    "Jobs",
    "Keyframes",
    "LiveContract",
    "LocalArtifactStore",
    "MemoryEventStore",
    "ModeReadiness",
    "NewerBody",
    "NotCancellable",
    "Progress",
    "Recovered",
    "References",
    "Refuse",
    "Refused",
    "Result",
    "Resumed",
    "RetryPolicy",
    "Runner",
    "RunnerConfig",
    "Running",
    "SQLiteEventStore",
    "SchemaTooNew",
    "ShuttingDown",
    "StoreUnavailable",
    "Submitted",
    "Topology",
    "UnknownJob",
    "apply",
    "classify",
    "fold",
    "place",
]

# A library configures no logging: its records go wherever the embedding program sends them
# (`h3core.logs.configure` for h3core's own commands).
logging.getLogger(__name__).addHandler(logging.NullHandler())
