"""The executor a service runs, chosen by `H3_EXECUTOR`."""

from __future__ import annotations

import uuid

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.uploads import LocalUploadStore
from h3core.executors.base import Executor
from h3core.executors.fake import FakeExecutor, FakePlan
from service.settings import Settings, SettingsError


def make_executor(settings: Settings, artifacts: LocalArtifactStore, uploads: LocalUploadStore) -> Executor:
    if settings.executor == "fake":
        return FakeExecutor(artifacts, default=FakePlan(step_seconds=settings.fake_step_seconds))
    if settings.executor == "comfyui":
        from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings
        from h3core.executors.comfyui.templates import TemplateError, load_templates, pick

        if not settings.comfyui_url:
            raise SettingsError("executor 'comfyui' needs H3_COMFYUI_URL (--comfyui-url)")
        try:
            templates = load_templates(settings.comfyui_templates)
            for mode in ("t2va", "fl2va", "ref2va"):
                pick(templates, mode, settings.comfyui_topology)
        except TemplateError as exc:
            raise SettingsError(str(exc)) from exc
        # One client id per store: a restarted h3core takes its socket (and its prompts' progress) back.
        client_id = "h3core-" + uuid.uuid5(uuid.NAMESPACE_URL, str(settings.db.resolve())).hex[:16]
        comfy = ComfyUISettings(
            url=settings.comfyui_url,
            client_id=client_id,
            topology=settings.comfyui_topology,
            lost_after_s=settings.comfyui_lost_after,
            unreachable_after_s=settings.comfyui_unreachable_after,
            log_path=settings.comfyui_log,
        )

        def upload_path(upload_id: str):
            upload = uploads.get(upload_id)
            if upload is None:
                raise FileNotFoundError(f"upload {upload_id} is gone from {uploads.root}")
            return uploads.path(upload)

        return ComfyUIExecutor(comfy, templates, artifacts, upload_path)
    raise SettingsError(f"executor {settings.executor!r} is not available in this build of h3core yet; use 'fake' or 'comfyui'")
