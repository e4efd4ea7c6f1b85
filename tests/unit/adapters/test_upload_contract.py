"""The upload-store contract (`h3core.testing.uploads`) run against every implementation: the
local store (its `.part` files beyond the contract are in test_uploads.py) and the memory fake."""

from __future__ import annotations

import itertools

import pytest

from h3core.adapters.uploads import LocalUploadStore, MemoryUploadStore
from h3core.testing.uploads import UploadStoreContract, chunks
from tests.factories import png

pytestmark = pytest.mark.anyio


class TestLocalUploadStore(UploadStoreContract):
    @pytest.fixture
    def make_uploads(self, tmp_path):
        folders = itertools.count()
        return lambda limits=None, **kw: LocalUploadStore(tmp_path / f"uploads-{next(folders)}", limits, **kw)

    def kept(self, uploads):
        return {p.name for p in uploads.root.iterdir()}


class TestMemoryUploadStore(UploadStoreContract):
    @pytest.fixture
    def make_uploads(self, tmp_path):
        folders = itertools.count()
        return lambda limits=None, **kw: MemoryUploadStore(limits, root=tmp_path / f"files-{next(folders)}", **kw)

    def kept(self, uploads):
        return set(uploads.ids()) | {p.name for p in uploads.root.iterdir()}


async def test_the_memory_fake_writes_a_file_only_when_its_path_is_asked_for(tmp_path):
    uploads = MemoryUploadStore(root=tmp_path / "files")
    upload = await uploads.put("image/png", chunks(png()))
    assert list(uploads.root.iterdir()) == [], "the bytes are in memory until a path is asked for"
    path = uploads.path(upload)
    assert path.read_bytes() == png() and uploads.path(upload) == path
    assert [p.name for p in uploads.root.iterdir()] == [upload.id]


async def test_the_memory_fake_without_a_folder_writes_to_a_temporary_one_removed_with_it():
    uploads = MemoryUploadStore()
    upload = await uploads.put("image/png", chunks(png()))
    path = uploads.path(upload)
    assert path.read_bytes() == png()
    del uploads
    import gc

    gc.collect()
    assert not path.parent.exists()
