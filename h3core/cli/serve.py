"""`h3core serve`: the HTTP service for h3-console (Litestar on uvicorn)."""

from __future__ import annotations

import functools
import os
import signal
from pathlib import Path
from typing import Annotated, Any

import anyio
from pydantic import ValidationError

from h3core.adapters.profiles import ProfileError
from h3core.cli.app import app
from h3core.cli.common import EXIT_DATA, console_err, fail, first_error, require_extra, take_runner_lock
from h3core.cli.common import setting_option as _opt
from h3core.cli.worker import serve_runner
from h3core.runtime.logs import configure as configure_logging
from h3core.runtime.settings import Settings, SettingsError
from h3core.runtime.store_retry import StoreUnavailable


@app.command()
def serve(
    role: Annotated[
        str | None, _opt("H3_ROLE", "all: HTTP and runner in one process; api: HTTP only; runner: jobs only (no HTTP) \\[all].")
    ] = None,
    tail_interval: Annotated[
        float | None, _opt("H3_TAIL_INTERVAL", "api role: seconds between looks for events the runner process stored \\[0.05].")
    ] = None,
    poll_interval: Annotated[
        float | None, _opt("H3_POLL_INTERVAL", "Seconds between a runner's looks for work other processes stored \\[0.5].")
    ] = None,
    host: Annotated[str | None, _opt("H3_HOST", "Address to listen on \\[127.0.0.1].")] = None,
    port: Annotated[int | None, _opt("H3_PORT", "Port \\[8100].")] = None,
    db: Annotated[str | None, _opt("H3_DB", "The store: a SQLite file or a postgresql:// URL \\[h3core.db].")] = None,
    artifacts: Annotated[Path | None, _opt("H3_ARTIFACTS", "Folder for videos \\[artifacts].")] = None,
    uploads: Annotated[Path | None, _opt("H3_UPLOADS", "Folder for keyframes and references \\[uploads].")] = None,
    executor: Annotated[str | None, _opt("H3_EXECUTOR", "pipeline, comfyui or fake \\[pipeline].")] = None,
    slots: Annotated[int | None, _opt("H3_SLOTS", "Jobs run at once \\[1].")] = None,
    openai_models: Annotated[
        str | None,
        _opt("H3_OPENAI_MODELS", "Model names /v1/videos answers to, comma-separated; the first is reported \\[minimax-h3]."),
    ] = None,
    stall_timeout: Annotated[
        float | None, _opt("H3_STALL_TIMEOUT", "Seconds without progress before a job is stalled \\[600].")
    ] = None,
    queue_timeout: Annotated[
        float | None,
        _opt("H3_QUEUE_TIMEOUT", "Seconds a job may wait unstarted after admission, then fails 'deadline' \\[no limit]."),
    ] = None,
    fake_step_seconds: Annotated[float | None, _opt("H3_FAKE_STEP_SECONDS", "The fake executor's time per step \\[0.5].")] = None,
    max_attempts: Annotated[int | None, _opt("H3_MAX_ATTEMPTS", "Retry policy: attempts per job \\[2].")] = None,
    retry_on: Annotated[
        str | None, _opt("H3_RETRY_ON", "Retry policy: failure kinds retried \\[executor_lost,interrupted].")
    ] = None,
    capacity_profile: Annotated[
        str | None,
        _opt(
            "H3_CAPACITY_PROFILE",
            "Capacity profile (a TOML file or a built-in name) applied whatever the hardware "
            "\\[the built-in one that describes the executor, if any].",
        ),
    ] = None,
    model_dir: Annotated[
        Path | None, _opt("H3_MODEL_DIR", "MiniMax-H3 weights, diffusers layout (pipeline) \\[a tiny random model].")
    ] = None,
    device: Annotated[str | None, _opt("H3_DEVICE", "Torch device of the pipeline \\[cpu].")] = None,
    dtype: Annotated[str | None, _opt("H3_DTYPE", "float32, bfloat16 or float16 (pipeline) \\[float32].")] = None,
    attention: Annotated[
        str | None,
        _opt(
            "H3_ATTENTION",
            "auto (measured at start), cudnn, flash, efficient, sage-fp16, sage-fp8 (both unverified on a GPU), "
            "sage-triton or math (pipeline) \\[auto].",
        ),
    ] = None,
    attention_math_max_tokens: Annotated[
        int | None, _opt("H3_ATTENTION_MATH_MAX_TOKENS", "Longest sequence the MATH kernel may take \\[4096].")
    ] = None,
    attention_tolerance: Annotated[
        float | None, _opt("H3_ATTENTION_TOLERANCE", "Relative L1 error an attention kernel may show at start \\[0.05].")
    ] = None,
    text_encoder_device: Annotated[
        str | None,
        _opt(
            "H3_TEXT_ENCODER_DEVICE", "Where the text encoder lives, e.g. cpu beside a GPU transformer \\[with the transformer]."
        ),
    ] = None,
    vae_device: Annotated[str | None, _opt("H3_VAE_DEVICE", "Where both VAEs live \\[with the transformer].")] = None,
    devices: Annotated[
        int | None, _opt("H3_DEVICES", "Run the pipeline on this many devices as groups of Ray actors \\[unset: in-process].")
    ] = None,
    group_size: Annotated[
        str | None, _opt("H3_GROUP_SIZE", "Ranks per group, or the sizes in order (2,1,1); each group is one slot \\[1].")
    ] = None,
    parallel: Annotated[str | None, _opt("H3_PARALLEL", "fsdp+ulysses, fsdp or ulysses within a group \\[fsdp+ulysses].")] = None,
    group_budgets: Annotated[
        str | None, _opt("H3_GROUP_BUDGETS", "Tokens a group of each size fits, measured (1=40000,2=90000) \\[unlimited].")
    ] = None,
    group_timeout: Annotated[
        float | None, _opt("H3_GROUP_TIMEOUT", "Seconds any collective may wait for a partner rank \\[120].")
    ] = None,
    watchdog_interval: Annotated[
        float | None, _opt("H3_WATCHDOG_INTERVAL", "Seconds between pings of idle groups \\[10].")
    ] = None,
    rank_threads: Annotated[int | None, _opt("H3_RANK_THREADS", "Torch threads per rank on a CPU \\[torch's default].")] = None,
    ray_address: Annotated[
        str | None, _opt("H3_RAY_ADDRESS", "An existing Ray cluster \\[unset: a local Ray on loopback].")
    ] = None,
    comfyui_url: Annotated[str | None, _opt("H3_COMFYUI_URL", "ComfyUI server (comfyui executor).")] = None,
    comfyui_topology: Annotated[str | None, _opt("H3_COMFYUI_TOPOLOGY", "single-gpu or raylight \\[single-gpu].")] = None,
    comfyui_templates: Annotated[Path | None, _opt("H3_COMFYUI_TEMPLATES", "A folder of extra workflow templates.")] = None,
    comfyui_log: Annotated[Path | None, _opt("H3_COMFYUI_LOG", "ComfyUI's log file (Raylight progress).")] = None,
    allowed_hosts: Annotated[
        str | None, _opt("H3_ALLOWED_HOSTS", "Host names answered besides loopback ones, comma-separated (* for any) \\[none].")
    ] = None,
    cors_origins: Annotated[
        str | None,
        _opt("H3_CORS_ORIGINS", "Origins whose pages may call the API (scheme://host:port), comma-separated \\[none]."),
    ] = None,
    metrics_port: Annotated[
        int | None, _opt("H3_METRICS_PORT", "Serve /metrics on this port instead of the API's \\[unset].")
    ] = None,
    metrics_host: Annotated[str | None, _opt("H3_METRICS_HOST", "Address of the /metrics listener \\[127.0.0.1].")] = None,
    comfyui_template: Annotated[
        str | None,
        _opt(
            "H3_COMFYUI_TEMPLATE", "The template per mode, by name: t2va=core-nodes-t2va,fl2va=... \\[minimax-h3-MODE-TOPOLOGY]."
        ),
    ] = None,
    comfyui_concurrency: Annotated[
        int | None, _opt("H3_COMFYUI_CONCURRENCY", "Prompts ComfyUI runs at once; jobs beyond it wait queued in h3core \\[1].")
    ] = None,
    comfyui_on_stop: Annotated[
        str | None,
        _opt("H3_COMFYUI_ON_STOP", "On SIGTERM: detach (prompts run on; the next start re-attaches) or interrupt \\[detach]."),
    ] = None,
    config: Annotated[Path | None, _opt("H3_CONFIG", "A TOML settings file (same names as these options).")] = None,
    log_level: Annotated[str | None, _opt("H3_LOG_LEVEL", "debug, info, warning or error \\[info].")] = None,
    log_format: Annotated[str | None, _opt("H3_LOG_FORMAT", "Log records as text or JSON lines (json) \\[text].")] = None,
    store_retry: Annotated[
        float | None, _opt("H3_STORE_RETRY", "Seconds a failing store is retried before the process exits non-zero \\[30].")
    ] = None,
    node: Annotated[str | None, _opt("H3_NODE", "PostgreSQL store: this runner node's id \\[the host name].")] = None,
    lease: Annotated[
        float | None,
        _opt("H3_LEASE", "PostgreSQL store: seconds without a heartbeat before others take a node's jobs over \\[30]."),
    ] = None,
    max_body_bytes: Annotated[int | None, _opt("H3_MAX_BODY_BYTES", "Largest JSON request body, in bytes \\[1048576].")] = None,
    max_upload_bytes: Annotated[
        int | None, _opt("H3_MAX_UPLOAD_BYTES", "Largest upload in bytes (each kind has a lower bound of its own) \\[524288000].")
    ] = None,
    max_upload_pixels: Annotated[
        int | None, _opt("H3_MAX_UPLOAD_PIXELS", "Largest image upload, width x height in pixels \\[16777216].")
    ] = None,
    cancel_grace: Annotated[
        float | None, _opt("H3_CANCEL_GRACE", "Seconds an executor gets to stop a cancelled or stalled job \\[30].")
    ] = None,
    attempt_deadline: Annotated[
        float | None, _opt("H3_ATTEMPT_DEADLINE", "Seconds an attempt may run before it fails `deadline` \\[unset].")
    ] = None,
    prompt_cache: Annotated[int | None, _opt("H3_PROMPT_CACHE", "Prompt embeddings the pipeline keeps \\[32].")] = None,
    comfyui_lost_after: Annotated[
        float | None, _opt("H3_COMFYUI_LOST_AFTER", "Seconds a prompt may be in neither ComfyUI's queue nor history \\[15].")
    ] = None,
    header_timeout: Annotated[
        float | None, _opt("H3_HEADER_TIMEOUT", "Seconds a request's line and headers may take to arrive \\[20].")
    ] = None,
    body_timeout: Annotated[
        float | None, _opt("H3_BODY_TIMEOUT", "Seconds a request's body may take after its headers \\[20].")
    ] = None,
    min_request_rate: Annotated[
        float | None, _opt("H3_MIN_REQUEST_RATE", "Bytes per second of a request that earn it one more second \\[500].")
    ] = None,
    keep_alive_timeout: Annotated[
        float | None, _opt("H3_KEEP_ALIVE_TIMEOUT", "Idle seconds a connection is kept between requests \\[5].")
    ] = None,
    max_connections: Annotated[
        int | None, _opt("H3_MAX_CONNECTIONS", "Connections served at once; requests beyond get 503 \\[512].")
    ] = None,
    ready_cache: Annotated[
        float | None,
        _opt("H3_READY_CACHE", "Seconds /readyz reuses its look at the store and the runner process; 0: every request \\[1]."),
    ] = None,
    comfyui_unreachable_after: Annotated[
        float | None, _opt("H3_COMFYUI_UNREACHABLE_AFTER", "Seconds ComfyUI may not answer before its jobs fail \\[300].")
    ] = None,
    comfyui_stop_wait: Annotated[
        float | None,
        _opt("H3_COMFYUI_STOP_WAIT", "Seconds a stopped prompt is followed (its job keeping its slot) until it ends \\[600]."),
    ] = None,
    webhook_endpoints: Annotated[
        str | None,
        _opt(
            "H3_WEBHOOK_ENDPOINTS",
            "Endpoints sent every job's events, comma-separated: jobs=URL, jobs:start+progress=URL, openai=URL; "
            "openai@ENV_NAME=URL: signed with the secret in ENV_NAME \\[none].",
        ),
    ] = None,
    webhooks_allow: Annotated[
        str | None,
        _opt(
            "H3_WEBHOOKS_ALLOW",
            "Hosts and CIDR ranges webhooks may reach although private or loopback, comma-separated \\[none].",
        ),
    ] = None,
) -> None:
    """Serve the HTTP API (OpenAPI at /schema). Tokens come from H3_API_TOKENS only, the webhook secret from
    H3_WEBHOOK_SECRET only (never a flag)."""
    require_extra("service", "litestar", "uvicorn", "prometheus_client")
    import uvicorn

    from h3core.service import deadlines
    from h3core.service.app import build_service, create_app, create_metrics_app

    if config is not None:
        os.environ["H3_CONFIG"] = str(config)
    given = {
        k: v
        for k, v in locals().items()
        if k not in ("config", "uvicorn", "deadlines", "build_service", "create_app", "create_metrics_app") and v is not None
    }
    try:
        settings = Settings(**given)
        configure_logging(settings.log_format, settings.log_level)
        settings.check_exposure()
        service = build_service(settings)
        application = create_app(settings, service) if settings.role != "runner" else None  # no HTTP there
    except ValidationError as exc:
        fail(f"invalid setting: {first_error(exc)}")
    except (SettingsError, ProfileError) as exc:
        fail(str(exc))
    lock = take_runner_lock(settings.db) if settings.role != "api" else None  # the api role runs no job
    if settings.role == "runner":
        try:
            _run_jobs(service)
        finally:
            if lock is not None:
                lock.release()
        return
    auth = f"{len(settings.api_tokens)} API token(s)" if settings.api_tokens else "no authentication (loopback only)"
    console_err().print(
        f"h3core: http://{settings.host}:{settings.port}  store {settings.db}  "
        f"{'runner in another process' if settings.role == 'api' else f'executor {settings.executor}'}  {auth}  "
        f"({_server_impl()})"
        + (
            f"  metrics http://{settings.metrics_host}:{settings.metrics_port}/metrics"
            if settings.metrics_port is not None
            else ""
        )
    )
    limits = deadlines.ReadLimits(
        header_s=settings.header_timeout,
        header_max_s=max(settings.header_timeout, 60.0),
        body_s=settings.body_timeout,
        min_rate=settings.min_request_rate,
    )
    assert application is not None  # only the runner role has none, and it returned above
    json_logs: dict[str, Any] = {"log_config": None} if settings.log_format == "json" else {}
    server_config = uvicorn.Config(
        application,
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # uvloop and httptools (uvicorn[standard]) where they import, asyncio and h11 otherwise:
        # uvicorn's defaults, named so that no one sets them to something slower unawares. The
        # HTTP protocol is the one "auto" picks, with read deadlines (service/deadlines.py).
        loop="auto",
        timeout_graceful_shutdown=max(5, int(settings.cancel_grace) + 5),
        http=deadlines.protocol(limits),
        timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]  # uvicorn says int; a float works
        limit_concurrency=settings.max_connections,
        access_log=settings.log_level == "debug",
        # JSON lines: uvicorn's records go through h3core's handler rather than uvicorn's own.
        **json_logs,
    )
    server = _server(server_config, on_exit=service.begin_shutdown)
    service.on_fatal = lambda: setattr(server, "should_exit", True)
    metrics_server = None
    if settings.metrics_port is not None:
        metrics_config = uvicorn.Config(
            create_metrics_app(settings, service),
            log_level=settings.log_level,
            lifespan="off",
            access_log=False,
            loop="auto",
            http=deadlines.protocol(limits),
            timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]  # uvicorn says int; a float works
        )
        metrics_server = (_quiet_server(metrics_config), _listen(settings.metrics_host, settings.metrics_port))
    _freeze_startup_objects()
    # uvicorn re-raises the signal it stopped on, once it is done; a stop we asked for is a
    # clean exit (status 0), so the re-raised signal lands on a handler that does nothing.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    try:
        if metrics_server is None:
            server.run()
        else:
            _run_with_metrics(server, *metrics_server)
    finally:
        if lock is not None:
            lock.release()
    if service.fatal is not None:
        fail(f"h3core stopped, the store is unusable: {service.fatal}", EXIT_DATA)


def _run_jobs(svc) -> None:
    """The runner role: the jobs of the store, with the executor the settings name, until SIGTERM
    or SIGINT; no HTTP (an api-role process on the same store takes the requests)."""
    s, runner = svc.settings, svc.runner
    assert runner is not None  # the runner role runs one
    console_err().print(f"h3core runner: pid {os.getpid()}, store {s.db}, executor {s.executor}, slots {runner.slot_count()}")
    _freeze_startup_objects()
    try:
        how = anyio.run(
            functools.partial(serve_runner, runner, verbose=False, name="h3core runner", beside=[svc.run_webhooks]),
            backend_options=_loop_options(),
        )
    except StoreUnavailable as exc:
        fail(f"h3core runner stopped, the store is unusable: {exc}", EXIT_DATA)
    finally:
        svc.store.close()
    console_err().print(f"h3core runner: stopped ({how})")


def _freeze_startup_objects() -> None:
    """Everything made at start-up (modules, the app, schemas) lives as long as the process:
    frozen, the cyclic GC stops scanning it on every full collection. Those scans paused the
    event loop for 70-100 ms a few times a minute under load: status p99 35-64 ms, frozen 12-13 ms
    (bench_http.py --split --poll-every 0.5, mixed)."""
    import gc

    gc.collect()
    gc.freeze()


def _loop_options() -> dict[str, bool]:
    from importlib.util import find_spec

    return {"use_uvloop": find_spec("uvloop") is not None}  # as uvicorn's "auto" would pick


def _server_impl() -> str:
    """What uvicorn's "auto" picks: uvloop and httptools when installed (uvicorn[standard])."""
    from importlib.util import find_spec

    loop = "uvloop" if _loop_options()["use_uvloop"] else "asyncio"
    http = "httptools" if find_spec("httptools") is not None else "h11"
    return f"{loop}, {http}"


def _listen(host: str, port: int):
    """A bound socket for a second listener, so a taken port stops `serve` at once, saying which."""
    import socket

    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        fail(f"cannot listen for /metrics on {host}:{port}: {exc.strerror or exc}")
    return sock


def _run_with_metrics(server, metrics, sock) -> None:
    """The API's server and the /metrics listener on one event loop; the metrics one stops when
    the API's does (it leaves the signals to the API's server)."""
    import asyncio

    async def both() -> None:
        task = asyncio.create_task(metrics.serve(sockets=[sock]))
        try:
            await server.serve()
        finally:
            metrics.should_exit = True
            await task

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(both())


def _quiet_server(config):
    """A second uvicorn server in the process: it leaves the signals to the API's server."""
    import contextlib

    import uvicorn

    class Server(uvicorn.Server):
        def capture_signals(self):
            return contextlib.nullcontext()

    return Server(config)


def _server(config, on_exit):
    """uvicorn's server, told about SIGTERM/SIGINT at once, so the runner stops and live
    streams end before uvicorn waits for open connections to close."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            on_exit()
            super().handle_exit(sig, frame)

    return Server(config)
