"""The pipeline on groups of Ray actors, one per device: FSDP2 weight sharding, Ulysses sequence
parallelism, and groups that rebuild themselves when a rank fails (needs the `distributed` extra)."""

from h3core.executors.distributed.cluster import ClusterSettings
from h3core.executors.distributed.executor import DistributedExecutor, DistributedSettings
from h3core.executors.distributed.group import Group, GroupError
from h3core.executors.distributed.rank import Payload, RankSpec, RankWorker
from h3core.executors.reports import GroupHealth

__all__ = [
    "ClusterSettings",
    "DistributedExecutor",
    "DistributedSettings",
    "Group",
    "GroupError",
    "GroupHealth",
    "Payload",
    "RankSpec",
    "RankWorker",
]
