"""The artifact-store contract (`h3core.testing.artifacts`) run against every implementation: the
local store (its crash-safety beyond the contract is in test_artifacts.py) and the memory fake."""

from __future__ import annotations

import pytest

from h3core.adapters.artifacts import LocalArtifactStore, MemoryArtifactStore
from h3core.testing.artifacts import ArtifactStoreContract


class TestLocalArtifactStore(ArtifactStoreContract):
    @pytest.fixture
    def artifacts(self, tmp_path):
        return LocalArtifactStore(tmp_path / "artifacts")


class TestMemoryArtifactStore(ArtifactStoreContract):
    @pytest.fixture
    def artifacts(self, tmp_path):
        return MemoryArtifactStore(tmp_path / "artifacts")


def test_the_memory_fake_keeps_nothing_beside_the_videos(tmp_path):
    store = MemoryArtifactStore(tmp_path / "artifacts")
    store.delete_video("0123456789abcdef0123456789abcdef")
    staged = store.staging("0123456789abcdef0123456789abcdef", 1)
    staged.write_bytes(b"video")
    artifact = store.commit(staged, job_id="0123456789abcdef0123456789abcdef", attempt=1, frames=1, duration_s=0.1)
    on_disk = sorted(p.relative_to(store.root).as_posix() for p in store.root.rglob("*") if p.is_file())
    assert on_disk == [artifact.path], "records and marks are in memory"
    assert MemoryArtifactStore(tmp_path / "artifacts").committed("0123456789abcdef0123456789abcdef", 1) is None
