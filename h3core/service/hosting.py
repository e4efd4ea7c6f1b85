"""Hosting the HTTP service in this process: uvicorn serving the app (and /metrics on a listener of
its own where H3_METRICS_PORT says), until SIGTERM or SIGINT stops it as a clean exit.

`h3core serve` builds the settings, the service and the app, and hands them to `host`. Nothing here
imports uvicorn or Litestar until it runs: the command line imports this module without the
`service` extra installed.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import logging
import signal
import socket
from importlib.util import find_spec
from typing import TYPE_CHECKING, Any

from h3core.service import connections, deadlines, targets

if TYPE_CHECKING:
    import uvicorn
    from litestar import Litestar

    from h3core.service.context import Service

log = logging.getLogger("h3core.service")

__all__ = ["HostingError", "freeze_startup_objects", "host", "loop_options", "server_impl"]


class HostingError(RuntimeError):
    """The service cannot start serving; the message says what and why (a taken port)."""


def host(service: Service, application: Litestar) -> None:
    """Serve `application` with uvicorn as `service.settings` say, until SIGTERM or SIGINT: the
    service is told at once (its runner stops, live streams end), then uvicorn waits for open
    connections. A stop so asked for returns normally; a fatal failure (the store unusable, a task
    the process needs failed: `Service.run_runner`) ends the serving too, left in `service.fatal`
    for the caller. Raises HostingError where the /metrics
    listener cannot bind its port."""
    import uvicorn

    from h3core.service.app import create_metrics_app

    settings = service.settings
    limits = deadlines.ReadLimits(
        header_s=settings.header_timeout,
        header_max_s=max(settings.header_timeout, 60.0),
        body_s=settings.body_timeout,
        min_rate=settings.min_request_rate,
        idle_s=settings.keep_alive_timeout,
    )
    # Idle connections count against no request (connections.py): uvicorn's limit_concurrency,
    # which counted them, is left unset.
    held = connections.open_files_for(settings.max_open_connections)
    if held < settings.max_open_connections:
        log.warning("holding at most %d connections open: the open-file limit allows no more", held)
    json_logs: dict[str, Any] = {"log_config": None} if settings.log_format == "json" else {}
    server_config = uvicorn.Config(
        connections.Admission(application, settings.max_connections),
        host=settings.host,
        port=settings.port,
        log_level=settings.log_level,
        # uvloop and httptools (uvicorn[standard]) where they import, asyncio and h11 otherwise:
        # uvicorn's defaults, named so that no one sets them to something slower unawares. The
        # HTTP protocol is the one "auto" picks, with read deadlines (service/deadlines.py) and the host
        # of an absolute-form target taken as its Host (service/targets.py).
        loop="auto",
        timeout_graceful_shutdown=max(5, int(settings.cancel_grace) + 5),
        http=connections.capped(targets.with_authority(deadlines.protocol(limits)), held),
        timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]  # uvicorn says int; a float works
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
            http=connections.capped(targets.with_authority(deadlines.protocol(limits)), held),
            timeout_keep_alive=settings.keep_alive_timeout,  # type: ignore[arg-type]  # uvicorn says int; a float works
        )
        metrics_server = (_quiet_server(metrics_config), _listen(settings.metrics_host, settings.metrics_port))
    freeze_startup_objects()
    # uvicorn re-raises the signal it stopped on, once it is done; a stop we asked for is a
    # clean exit (status 0), so the re-raised signal lands on a handler that does nothing.
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, lambda *_: None)
    if metrics_server is None:
        server.run()
    else:
        _run_with_metrics(server, *metrics_server)


def freeze_startup_objects() -> None:
    """Everything made at start-up (modules, the app, schemas) lives as long as the process:
    frozen, the cyclic GC stops scanning it on every full collection. Those scans paused the
    event loop for 70-100 ms a few times a minute under load: status p99 35-64 ms, frozen 12-13 ms
    (bench.throughput.http_load --split --poll-every 0.5, mixed)."""
    gc.collect()
    gc.freeze()


def loop_options() -> dict[str, bool]:
    """anyio's asyncio options for the event loop uvicorn's "auto" would pick: uvloop where installed."""
    return {"use_uvloop": find_spec("uvloop") is not None}


def server_impl() -> str:
    """What uvicorn's "auto" picks: uvloop and httptools when installed (uvicorn[standard])."""
    loop = "uvloop" if loop_options()["use_uvloop"] else "asyncio"
    http = "httptools" if find_spec("httptools") is not None else "h11"
    return f"{loop}, {http}"


def _listen(host: str, port: int) -> socket.socket:
    """A bound socket for a second listener, so a taken port stops `serve` at once, saying which."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise HostingError(f"cannot listen for /metrics on {host}:{port}: {exc.strerror or exc}") from exc
    return sock


def _run_with_metrics(server: uvicorn.Server, metrics: uvicorn.Server, sock: socket.socket) -> None:
    """The API's server and the /metrics listener on one event loop; the metrics one stops when
    the API's does (it leaves the signals to the API's server)."""

    async def both() -> None:
        task = asyncio.create_task(metrics.serve(sockets=[sock]))
        try:
            await server.serve()
        finally:
            metrics.should_exit = True
            await task

    with asyncio.Runner(loop_factory=server.config.get_loop_factory()) as runner:
        runner.run(both())


def _quiet_server(config: uvicorn.Config) -> uvicorn.Server:
    """A second uvicorn server in the process: it leaves the signals to the API's server."""
    import uvicorn

    class Server(uvicorn.Server):
        def capture_signals(self):
            return contextlib.nullcontext()

    return Server(config)


def _server(config: uvicorn.Config, on_exit) -> uvicorn.Server:
    """uvicorn's server, told about SIGTERM/SIGINT at once, so the runner stops and live
    streams end before uvicorn waits for open connections to close."""
    import uvicorn

    class Server(uvicorn.Server):
        def handle_exit(self, sig, frame):
            on_exit()
            super().handle_exit(sig, frame)

    return Server(config)
