"""Artifact stores: the contract (`base`), the local file system's (`local`), and a fake that
keeps its records in memory (`memory`), for tests."""

from h3core.adapters.artifacts.base import ArtifactStore, FileStat, media_type, sha256_file
from h3core.adapters.artifacts.local import LocalArtifactStore
from h3core.adapters.artifacts.memory import MemoryArtifactStore

__all__ = ["ArtifactStore", "FileStat", "LocalArtifactStore", "MemoryArtifactStore", "media_type", "sha256_file"]
