"""The composition root: one node of h3core built from its `Settings`, the one place that does.

`h3core serve` (every role), `h3core worker`, `h3core capacity`, `h3core enqueue` and `Jobs`
build their store, artifact and upload stores, executor, admission, submissions, runner, live
events and webhook deliveries here, so that they cannot drift apart: a process that runs jobs on
PostgreSQL is the node `Settings.node_id()` names, whichever command started it, and a process
that only takes requests judges them as the service does.

What it builds, by role:

- `all` and `runner`: the executor, the runner (which holds the submissions), the admission
  contract of this executor (on PostgreSQL, of any live node), the capabilities file an API
  process beside it reads, and the webhook deliveries (with H3_WEBHOOK_SECRET or endpoints).
- `api`: no executor and no runner: submissions alone, judged by what the runner process or the
  live nodes state they can run, and the store's tail for the events other processes write.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.artifacts.location import artifacts_at
from h3core.adapters.profiles import builtin_profiles, load_profile_ref
from h3core.adapters.store.base import EventStore
from h3core.adapters.store.location import open_store_at
from h3core.adapters.store.nodes import WithNodeLeases
from h3core.adapters.uploads import DEFAULT_LIMITS, LocalUploadStore
from h3core.domain.capacity import CapacityProfile
from h3core.domain.webhooks import Allow
from h3core.executors.base import Executor
from h3core.runtime.admission import CapabilityFile, LocalAdmission, ServiceAdmission, capabilities_path
from h3core.runtime.bus import EventBus
from h3core.runtime.delivery_process import DeliveryProcess, delivery_for
from h3core.runtime.executor_factory import make_executor
from h3core.runtime.fleet import FleetAdmission
from h3core.runtime.runner import Runner
from h3core.runtime.settings import Settings, SettingsError
from h3core.runtime.submissions import Submissions, WebhookPolicy
from h3core.runtime.tail import StoreTail

__all__ = ["Files", "Node", "build_executor", "build_node", "fleet_interval", "open_files", "service_admission", "webhook_policy"]


@dataclass(frozen=True)
class Files:
    """Where a node keeps files: the videos it commits and the uploads requests name."""

    artifacts: ArtifactStore
    uploads: LocalUploadStore


@dataclass
class Node:
    """One node's parts, wired together. `runner` and `executor` are None in the `api` role."""

    settings: Settings
    store: EventStore
    files: Files
    # What requests are judged by: the profile and what can run (on PostgreSQL, on any live node).
    contract: ServiceAdmission
    submissions: Submissions
    runner: Runner | None
    executor: Executor | None
    # Every event this process learns of: the runner's, or, where other processes write the same
    # store (the api role, a PostgreSQL node), the store tail's.
    bus: EventBus
    tail: StoreTail | None
    # Where the runner runs with H3_WEBHOOK_SECRET or endpoints: the delivering child process.
    webhooks: DeliveryProcess | None


def fleet_interval(settings: Settings) -> float:
    """How often a node reads the others' statements: well within a lease (a beat is a third)."""
    return min(1.0, settings.lease / 3)


def open_artifacts(settings: Settings) -> ArtifactStore:
    """The artifact store the settings name: a folder, or a bucket (`s3://`) with this node's
    staging folder; `SettingsError` where the s3 extra is missing."""
    try:
        return artifacts_at(settings.artifacts, staging=settings.staging)
    except ImportError:
        raise SettingsError("artifacts: an s3:// store needs the s3 extra (pip install 'h3core[s3]')") from None


def open_files(settings: Settings) -> Files:
    """The artifact and upload stores the settings name (created where missing; `OSError` where
    they cannot be), with the upload limits the settings set."""
    artifacts = open_artifacts(settings)
    limits = {k: min(v, settings.max_upload_bytes) for k, v in DEFAULT_LIMITS.items()}
    if isinstance(settings.uploads, Path):
        return Files(artifacts, LocalUploadStore(settings.uploads, limits, max_pixels=settings.max_upload_pixels))
    try:
        from h3core.adapters.uploads.s3 import S3UploadStore

        cache = settings.staging / "uploads"  # this node's copies
        uploads = S3UploadStore(settings.uploads, cache, limits, max_pixels=settings.max_upload_pixels)
        return Files(artifacts, uploads)
    except ImportError:
        raise SettingsError("uploads: an s3:// store needs the s3 extra (pip install 'h3core[s3]')") from None


def build_executor(settings: Settings, files: Files | None = None) -> Executor:
    """The executor the settings name (`make_executor`), on the settings' files unless given."""
    files = files or open_files(settings)
    return make_executor(settings, files.artifacts, files.uploads)


def webhook_policy(settings: Settings) -> WebhookPolicy:
    """Whether a submit may name a webhook (a secret to sign with), and where one may point."""
    return WebhookPolicy(signing=settings.webhook_secret is not None, allow=Allow(settings.webhooks_allow))


def _profile(settings: Settings) -> CapacityProfile | None:
    ref = settings.capacity_profile
    return load_profile_ref(ref) if ref is not None else None


def service_admission(store: EventStore, settings: Settings) -> ServiceAdmission:
    """What a process with no executor judges a submit by: on PostgreSQL every live runner node's
    statement (the request is queued if one can run it), else what the runner on the SQLite file
    published. `ProfileError` for a capacity profile that cannot be read."""
    profile = _profile(settings)
    if isinstance(store, WithNodeLeases):  # PostgreSQL: the nodes state what they run in the store
        return FleetAdmission(
            store.leases,
            builtin_profiles(),
            profile=profile,
            interval_s=fleet_interval(settings),
            max_video_seconds=settings.max_video_seconds,
        )
    board = CapabilityFile(capabilities_path(settings.db), interval_s=settings.tail_interval)
    return LocalAdmission(board.read, builtin_profiles(), profile=profile, max_video_seconds=settings.max_video_seconds)


def build_node(settings: Settings, *, store: EventStore | None = None, executor: Executor | None = None) -> Node:
    """The node `settings` describe. `store`: one already open (else the settings' `db` is opened,
    as a node where it is PostgreSQL and the role runs jobs). `executor`: one already built (else
    `make_executor`'s). Raises `SettingsError` for settings that cannot work together, `ProfileError`
    for a profile that cannot be read, and `OSError` for folders that cannot be made."""
    if store is None:
        store = open_store_at(settings.db, **settings.store_options())
    files = open_files(settings)
    config = settings.runner_config()
    policy = webhook_policy(settings)
    # Where other processes write the same store, this one's live events come from the store
    # (every node's, each once, in store order), not from its own runner alone.
    shared = settings.role == "api" or bool(settings.store_options())
    # The writer publishes what it writes to its own bus; a tail's bus is apart, or every event
    # written here would reach it twice.
    bus = EventBus()
    tail = StoreTail(store, bus, interval_s=settings.tail_interval, retry_s=settings.store_retry) if shared else None
    if settings.role == "api":  # no executor here: the runner process has it, and states what it can run
        judged_by = service_admission(store, settings)
        submissions = Submissions(store, config, admission=judged_by, uploads=files.uploads, webhooks=policy)
        return Node(settings, store, files, judged_by, submissions, None, None, bus, tail, None)
    if executor is None:
        executor = build_executor(settings, files)
    profile = _profile(settings)
    bound = settings.max_video_seconds
    local = LocalAdmission(executor.capabilities, builtin_profiles(), profile=profile, max_video_seconds=bound)
    contract: ServiceAdmission = (  # on PostgreSQL: this node's executor, and every other live node's statement
        FleetAdmission(
            store.leases,
            builtin_profiles(),
            profile=profile,
            local=local,
            interval_s=fleet_interval(settings),
            max_video_seconds=bound,
        )
        if isinstance(store, WithNodeLeases)
        else local
    )
    runner = Runner(
        store,
        executor,
        config,
        admission=contract,
        board=CapabilityFile(capabilities_path(settings.db)),  # an API process beside this one admits by it
        artifacts=files.artifacts,
        uploads=files.uploads,
        webhooks=policy,
        bus=None if shared else bus,
    )
    webhooks = delivery_for(settings)  # SettingsError: endpoints without a secret
    return Node(settings, store, files, contract, runner.submissions, runner, executor, bus, tail, webhooks)
