"""Uploads in a real S3-compatible object store (SeaweedFS, tests/seaweed.py): the shipped
upload contract, and an upload one node received read, record and bytes, by another node that
shares no folder with it."""

from __future__ import annotations

import itertools

import pytest

from h3core.adapters.uploads.s3 import S3UploadStore
from h3core.testing.uploads import UploadStoreContract, chunks
from tests.factories import png

pytestmark = pytest.mark.anyio


def objects(store: S3UploadStore) -> set[str]:
    listed = store.s3.list_objects_v2(Bucket=store.bucket, Prefix=store.prefix + "/")
    return {o["Key"].rsplit("/", 1)[-1] for o in listed.get("Contents", [])}


class TestS3UploadStore(UploadStoreContract):
    @pytest.fixture
    def make_uploads(self, seaweed, s3_url, tmp_path):
        folders = itertools.count()
        client = seaweed.client()

        def make(limits=None, **kw):
            n = next(folders)  # each store a place of its own, as each has its own cache
            return S3UploadStore(f"{s3_url}/{n}", tmp_path / f"cache-{n}", limits, client=client, **kw)

        return make

    def kept(self, uploads):
        """What this node's cache holds and what the bucket holds: a refusal leaves neither."""
        return {p.name for p in uploads.root.iterdir()} | {f"s3:{name}" for name in objects(uploads)}


async def test_an_upload_received_by_one_node_is_read_by_another_with_its_record_and_bytes(seaweed, s3_url, tmp_path):
    receiving = S3UploadStore(s3_url, tmp_path / "node-a", client=seaweed.client())
    running = S3UploadStore(s3_url, tmp_path / "node-b", client=seaweed.client())
    image = png(64, 48)
    upload = await receiving.put("image/png", chunks(image))
    assert objects(receiving) == {upload.id}, "in the bucket before the id is answered"
    assert running.get(upload.id) == upload, "the record, from the object's metadata"
    assert list(running.root.iterdir()) == [], "nothing fetched until an executor asks for the file"
    path = running.path(upload)
    assert path.read_bytes() == image and path.parent == running.root
    assert running.path(upload) == path, "fetched once"
    assert running.get("u_" + "0" * 32) is None and running.get("../x") is None
    receiving.s3.delete_object(Bucket=receiving.bucket, Key=receiving._key(upload.id))
    third = S3UploadStore(s3_url, tmp_path / "node-c", client=seaweed.client())
    assert third.get(upload.id) is None, "gone from the bucket: gone for a node without a copy"
