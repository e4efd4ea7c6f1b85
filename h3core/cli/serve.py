"""`h3core serve`: the HTTP service for h3-console (Litestar on uvicorn)."""

from __future__ import annotations

import functools
import os
import signal
from typing import Any

import anyio
from pydantic import ValidationError

from h3core.adapters.profiles import ProfileError
from h3core.cli.app import app
from h3core.cli.common import EXIT_DATA, console_err, fail, first_error, require_extra, take_runner_lock
from h3core.cli.flags import settings_flags
from h3core.cli.worker import serve_runner
from h3core.runtime.logs import configure as configure_logging
from h3core.runtime.settings import Settings, SettingsError
from h3core.runtime.store_retry import StoreUnavailable


@app.command()
@settings_flags()  # every setting but the secrets
def serve(given: dict[str, Any]) -> None:
    """Serve the HTTP API (OpenAPI at /schema). Tokens come from H3_API_TOKENS only, the webhook secret from
    H3_WEBHOOK_SECRET only (never a flag)."""
    require_extra("service", "litestar", "uvicorn", "prometheus_client")
    import uvicorn

    from h3core.service import deadlines
    from h3core.service.app import build_service, create_app, create_metrics_app

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
