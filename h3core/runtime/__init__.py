"""The application layer: the runner and what it is built from, submissions (the write side every
door shares), the composition root (`build_node`), the embedding API (`Jobs`), the
live admission contract, the event bus and the store's followers, and the process settings and
executor factory that `serve` and `worker` both take.

It sits on the domain, the adapters and the executors; the HTTP service and the CLI sit on it.
Modules with a leading underscore are the runner's parts, private to this package.
"""

from h3core.runtime.admission import CapabilityFile, LocalAdmission
from h3core.runtime.bus import EventBus
from h3core.runtime.config import RunnerConfig
from h3core.runtime.errors import IdempotencyMismatch, InvalidSubmission, NotCancellable, NotQueued, Refused, ShuttingDown
from h3core.runtime.fleet import FleetAdmission
from h3core.runtime.jobs import JobCancelled, JobFailed, JobNotDone, Jobs
from h3core.runtime.node import Node, build_node
from h3core.runtime.runner import Runner
from h3core.runtime.store_retry import StoreUnavailable
from h3core.runtime.submissions import Submission, Submissions, WebhookPolicy
from h3core.runtime.subscription import Subscription

__all__ = [
    "CapabilityFile",
    "EventBus",
    "FleetAdmission",
    "IdempotencyMismatch",
    "InvalidSubmission",
    "JobCancelled",
    "JobFailed",
    "JobNotDone",
    "Jobs",
    "LocalAdmission",
    "Node",
    "NotCancellable",
    "NotQueued",
    "Refused",
    "Runner",
    "RunnerConfig",
    "ShuttingDown",
    "StoreUnavailable",
    "Submission",
    "Submissions",
    "Subscription",
    "WebhookPolicy",
    "build_node",
]
