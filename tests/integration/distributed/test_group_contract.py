"""The executor contract (`h3core.testing.executor`) held against a group of two Ray ranks
(FSDP2 + Ulysses, gloo) serving the tiny model."""

from __future__ import annotations

import pytest

from h3core.adapters.uploads import LocalUploadStore
from h3core.domain.topology import Topology
from h3core.executors.distributed.executor import DistributedExecutor, DistributedSettings
from h3core.testing.executor import ExecutorContract

pytestmark = [pytest.mark.timeout(300), pytest.mark.ray]


class TestGroupExecutor(ExecutorContract):
    @pytest.fixture
    def executor(self, artifacts, tiny_model, ray_host, tmp_path):
        uploads = LocalUploadStore(tmp_path / "uploads")
        settings = DistributedSettings(
            model_dir=tiny_model, topology=Topology.parse(2, "2", "fsdp+ulysses"), rank_threads=1, timeout_s=30.0
        )
        return DistributedExecutor(settings, artifacts, lambda upload_id: uploads.path(uploads.get(upload_id)), host=ray_host)
