"""The executor contract (`h3core.testing.executor`) held against the ComfyUI executor, on the
protocol-faithful fake ComfyUI."""

from __future__ import annotations

import pytest

from h3core.adapters.uploads import LocalUploadStore
from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings
from h3core.executors.comfyui.templates import builtin_templates
from h3core.testing.executor import ExecutorContract

pytestmark = pytest.mark.timeout(120)


class TestComfyUIExecutor(ExecutorContract):
    @pytest.fixture
    def executor(self, artifacts, comfy, tmp_path):
        uploads = LocalUploadStore(tmp_path / "uploads")
        settings = ComfyUISettings(
            url=comfy.url, client_id="h3core-contract", poll_min_s=0.05, poll_max_s=0.3, log_path=comfy.log_path
        )
        return ComfyUIExecutor(settings, builtin_templates(), artifacts, lambda upload_id: uploads.path(uploads.get(upload_id)))
