"""The executor a service runs, chosen by `H3_EXECUTOR`."""

from __future__ import annotations

import logging
import uuid
from importlib.util import find_spec
from pathlib import Path
from typing import Any

from h3core.adapters.artifacts import ArtifactStore
from h3core.adapters.store.location import local_dir
from h3core.adapters.uploads import LocalUploadStore
from h3core.domain.capabilities import MODES
from h3core.domain.topology import rank_device_problem
from h3core.executors.base import Executor
from h3core.executors.fake import FakeExecutor, FakeLimits, FakePlan
from h3core.runtime.settings import Settings, SettingsError

log = logging.getLogger("h3core.service")


def make_executor(settings: Settings, artifacts: ArtifactStore, uploads: LocalUploadStore) -> Executor:
    """The executor `settings.executor` names, committing to `artifacts` and reading `uploads`, not
    yet running. Raises `SettingsError` for settings it cannot run with (a missing extra or URL)."""
    if settings.executor == "fake":
        return FakeExecutor(
            artifacts,
            default=FakePlan(step_seconds=settings.fake_step_seconds),
            limits=FakeLimits(max_seconds=settings.fake_window_seconds, continues_segments=True),
            upload_path=_upload_path(uploads),
        )
    if settings.executor == "comfyui":
        from h3core.executors.comfyui.executor import ComfyUIExecutor, ComfyUISettings
        from h3core.executors.comfyui.templates import TemplateError, load_templates, pick

        if not settings.comfyui_url:
            raise SettingsError("executor 'comfyui' needs H3_COMFYUI_URL (--comfyui-url)")
        try:
            templates = load_templates(settings.comfyui_templates)
            for mode in MODES:
                pick(templates, mode, settings.comfyui_topology, settings.comfyui_template)
        except TemplateError as exc:
            setting = "comfyui_template" if settings.comfyui_template else "comfyui_templates"
            raise SettingsError(f"{setting}: {exc}") from exc
        # One client id per store: a restarted h3core takes its socket (and its prompts' progress) back.
        store = settings.db if isinstance(settings.db, str) else settings.db.resolve()  # a str is a postgresql:// URL
        client_id = "h3core-" + uuid.uuid5(uuid.NAMESPACE_URL, str(store)).hex[:16]
        comfy = ComfyUISettings(
            url=settings.comfyui_url,
            client_id=client_id,
            topology=settings.comfyui_topology,
            lost_after_s=settings.comfyui_lost_after,
            unreachable_after_s=settings.comfyui_unreachable_after,
            log_path=settings.comfyui_log,
            templates=dict(settings.comfyui_template),
            concurrency=settings.comfyui_concurrency,
            on_stop=settings.comfyui_on_stop,
            stop_wait_s=settings.comfyui_stop_wait,
        )

        return ComfyUIExecutor(comfy, templates, artifacts, _upload_path(uploads))
    if settings.executor == "pipeline":
        return _pipeline(settings, artifacts, uploads)
    raise SettingsError(f"unknown executor {settings.executor!r}")


def _upload_path(uploads: LocalUploadStore):
    def upload_path(upload_id: str) -> Path:
        upload = uploads.get(upload_id)
        if upload is None:
            raise FileNotFoundError(f"upload {upload_id} is gone from {uploads.root}")
        return uploads.path(upload)

    return upload_path


def tiny_model_dir(settings: Settings) -> Path:
    """Where the pipeline's tiny demo model lives when no weights are configured: beside the store."""
    return local_dir(settings.db) / "h3-tiny-model"


def attention_cache_path(settings: Settings) -> Path:
    """Where the measured attention decision is kept between starts: beside the store."""
    return local_dir(settings.db) / "h3-attention-cache.json"


def _pipeline(settings: Settings, artifacts: ArtifactStore, uploads: LocalUploadStore) -> Executor:
    # The settings are judged before torch and diffusers are imported (seconds): a setting that
    # cannot work stops `serve` at once. (`model` itself imports neither; the package needs numpy.)
    from h3core.executors.pipeline.model import FACTS_FILE, missing_parts

    topology = settings.topology()
    if topology is None and settings.slots != 1:
        raise SettingsError("slots: the pipeline executor runs one job at a time on its device; set slots to 1")
    if topology is not None and settings.slots not in (1, len(topology.group_sizes)):
        raise SettingsError(
            f"slots: with devices set, each of the {len(topology.group_sizes)} groups is one slot; leave slots unset"
        )
    if topology is not None:
        if find_spec("ray") is None:
            raise SettingsError(
                "devices: groups of devices need the distributed extra (ray): pip install 'h3core[pipeline,distributed]'"
            )
        if problem := rank_device_problem(settings.device, settings.placement()):
            raise SettingsError(f"device/attention: {problem}")
    model_dir = settings.model_dir
    missing = missing_parts(model_dir) if model_dir is not None else []
    if missing:
        raise SettingsError(f"model_dir: {model_dir} lacks {', '.join(missing)} (a diffusers-layout MiniMax-H3 folder)")
    try:
        from h3core.executors.pipeline.attention import AttentionError
        from h3core.executors.pipeline.executor import PipelineExecutor, PipelineSettings
        from h3core.executors.pipeline.tiny import make_tiny
    except ImportError as exc:
        raise SettingsError(
            f"executor 'pipeline' needs the pipeline extra (torch, diffusers, transformers): "
            f"pip install 'h3core[pipeline]', or serve with --executor fake ({exc})"
        ) from exc
    if model_dir is None:
        model_dir = tiny_model_dir(settings)
        if not (model_dir / FACTS_FILE).exists():
            make_tiny(model_dir)
            log.warning("no H3_MODEL_DIR: serving a tiny random-weight MiniMax-H3 written to %s (noise, not video)", model_dir)
    model: dict[str, Any] = {
        "model_dir": model_dir,
        "device": settings.device,
        "dtype": settings.dtype,
        "attention": settings.attention,
        "attention_tolerance": settings.attention_tolerance,
        "attention_cache": attention_cache_path(settings),
        "math_max_tokens": settings.attention_math_max_tokens,
        "prompt_cache": settings.prompt_cache,
        "placement": settings.placement(),
    }
    if topology is not None:
        return _groups(settings, topology, model, artifacts, uploads)
    try:
        return PipelineExecutor(PipelineSettings(**model), artifacts, _upload_path(uploads))
    except (AttentionError, RuntimeError) as exc:
        raise SettingsError(f"attention/device: {exc}") from exc


def _groups(settings: Settings, topology, model: dict, artifacts: ArtifactStore, uploads: LocalUploadStore) -> Executor:
    from h3core.executors.distributed import ClusterSettings, DistributedExecutor, DistributedSettings
    from h3core.executors.pipeline.attention import AttentionError

    try:
        return DistributedExecutor(
            DistributedSettings(
                **model,
                topology=topology,
                timeout_s=settings.group_timeout,
                watchdog_s=settings.watchdog_interval,
                rank_threads=settings.rank_threads,
                budgets=dict(settings.group_budgets),
                cluster=ClusterSettings(address=settings.ray_address),
            ),
            artifacts,
            _upload_path(uploads),
        )
    except (AttentionError, RuntimeError, ValueError) as exc:
        raise SettingsError(f"device/attention: {exc}") from exc
