"""Upload stores: the contract (`base`), the local file system's (`local`), a fake that keeps the
bytes in memory (`memory`), for tests, and what probing reads of a media file (`probing`)."""

from h3core.adapters.uploads.base import (
    CONTENT_TYPES,
    DEFAULT_LIMITS,
    DEFAULT_MAX_PIXELS,
    DEFAULT_MAX_SAMPLES,
    DEFAULT_PROBES,
    ID_PATTERN,
    MP4_TYPES,
    Kind,
    Upload,
    UploadRejected,
    UploadStore,
    is_upload_id,
)
from h3core.adapters.uploads.local import LocalUploadStore
from h3core.adapters.uploads.memory import MemoryUploadStore
from h3core.adapters.uploads.probing import Probed, probe, probe_image

__all__ = [
    "CONTENT_TYPES",
    "DEFAULT_LIMITS",
    "DEFAULT_MAX_PIXELS",
    "DEFAULT_MAX_SAMPLES",
    "DEFAULT_PROBES",
    "ID_PATTERN",
    "MP4_TYPES",
    "Kind",
    "LocalUploadStore",
    "MemoryUploadStore",
    "Probed",
    "Upload",
    "UploadRejected",
    "UploadStore",
    "is_upload_id",
    "probe",
    "probe_image",
]
