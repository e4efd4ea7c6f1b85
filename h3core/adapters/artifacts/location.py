"""Where an artifact store is: a folder, or an `s3://bucket/prefix` URL; the store at either, and
how to name it in a message."""

from __future__ import annotations

from pathlib import Path

from h3core.adapters.artifacts.base import ArtifactStore
from h3core.adapters.artifacts.local import LocalArtifactStore

__all__ = ["artifacts_at", "is_s3_url", "present", "where"]


def is_s3_url(location: str | Path) -> bool:
    """Whether `location` names an object store rather than a folder."""
    return isinstance(location, str) and location.startswith("s3://")


def artifacts_at(location: str | Path, *, staging: Path | None = None, create: bool = True) -> ArtifactStore:
    """The store at `location`: a folder (made unless `create` is False), or a bucket with
    `staging` as this process's staging folder (none: a temporary one). ImportError where an
    s3:// URL meets an install without the `s3` extra (boto3)."""
    if not is_s3_url(location):
        return LocalArtifactStore(location, create=create)
    import boto3  # noqa: F401 - ImportError here, not at the first request

    from h3core.adapters.artifacts.s3 import S3ArtifactStore

    return S3ArtifactStore(str(location), staging)


def where(store: ArtifactStore) -> str:
    """The store's location as an operator wrote it (a folder's path, a bucket's URL)."""
    from h3core.adapters.artifacts.s3 import S3ArtifactStore

    if isinstance(store, S3ArtifactStore):
        return store.url_text
    return str(getattr(store, "root", store))


def present(store: ArtifactStore) -> bool:
    """Whether the store is there at all (a folder that exists, a bucket that answers)."""
    from h3core.adapters.artifacts.s3 import S3ArtifactStore

    if isinstance(store, S3ArtifactStore):
        return store.present()
    root = getattr(store, "root", None)
    return root is None or Path(root).is_dir()
