"""h3core: run long GPU video-generation jobs so that none is ever stuck, lost or half-done."""

from h3core.adapters.artifacts import ArtifactStore, LocalArtifactStore
from h3core.adapters.store import (
    Conflict,
    EventStore,
    MemoryEventStore,
    SchemaTooNew,
    SQLiteEventStore,
    UnknownJob,
)
from h3core.bus import EventBus
from h3core.domain.admission import (
    AdmissionPolicy,
    Admit,
    AdmitAll,
    Ceiling,
    Decision,
    Refuse,
)
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
    Running,
    Submitted,
)
from h3core.domain.failures import FAILURE_KINDS, FailureKind
from h3core.domain.request import GenerationRequest, Keyframes, References
from h3core.domain.retry import RetryPolicy
from h3core.domain.state import IllegalEvent, JobState, apply, fold
from h3core.domain.topology import GroupPlan, Topology, place
from h3core.executors import (
    Executor,
    ExecutorFailure,
    FakeExecutor,
    FakePlan,
    Heartbeat,
    JobSpec,
    Result,
    classify,
)
from h3core.runner import (
    IdempotencyMismatch,
    NotCancellable,
    Refused,
    Runner,
    RunnerConfig,
    ShuttingDown,
)

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
    "Ceiling",
    "Conflict",
    "Decision",
    "Done",
    "Event",
    "EventBus",
    "EventStore",
    "Executor",
    "ExecutorFailure",
    "FAILURE_KINDS",
    "Failed",
    "FailureKind",
    "FakeExecutor",
    "FakePlan",
    "GenerationRequest",
    "GroupPlan",
    "Heartbeat",
    "IdempotencyMismatch",
    "IllegalEvent",
    "JobSpec",
    "JobState",
    "Keyframes",
    "LocalArtifactStore",
    "MemoryEventStore",
    "NotCancellable",
    "Progress",
    "References",
    "Refuse",
    "Refused",
    "Result",
    "RetryPolicy",
    "Runner",
    "RunnerConfig",
    "Running",
    "SQLiteEventStore",
    "SchemaTooNew",
    "ShuttingDown",
    "Submitted",
    "Topology",
    "UnknownJob",
    "apply",
    "classify",
    "fold",
    "place",
]
