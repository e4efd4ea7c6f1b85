"""The executor contract (`h3core.testing.executor`) held against the pipeline on the tiny model."""

from __future__ import annotations

import pytest

from h3core.adapters.uploads import LocalUploadStore
from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings
from h3core.testing.executor import ExecutorContract

pytestmark = pytest.mark.timeout(300)


class TestPipelineExecutor(ExecutorContract):
    @pytest.fixture
    def executor(self, artifacts, tiny_model, attention_cache, tmp_path):
        uploads = LocalUploadStore(tmp_path / "uploads")
        settings = PipelineSettings(model_dir=tiny_model, attention_cache=attention_cache)
        return PipelineExecutor(settings, artifacts, lambda upload_id: uploads.path(uploads.get(upload_id)))
