"""The Litestar application for h3-console: a thin shell over the runner and its stores."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import anyio
from litestar import Litestar, Request, Response, Router
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotAuthorizedException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.status_codes import HTTP_422_UNPROCESSABLE_ENTITY, HTTP_500_INTERNAL_SERVER_ERROR, HTTP_503_SERVICE_UNAVAILABLE
from litestar.types import Message, Scope

from h3core.runtime.deletions import DeletionSweep
from h3core.runtime.settings import Settings
from h3core.runtime.store_retry import StoreUnavailable, transient
from h3core.service.auth import bearer_guard
from h3core.service.bodies import BodyLimits, ServiceRequest
from h3core.service.compression import compression
from h3core.service.console import console_router
from h3core.service.context import Service, build_service
from h3core.service.crosssite import CrossSiteGuard, CrossSitePolicy
from h3core.service.methods import with_options
from h3core.service.openapi import exact_components
from h3core.service.routes import jobs, nodes, ops, uploads, videos
from h3core.service.schema_page import SCHEMA_PATH, asset, render_plugin
from h3core.service.strictness import ModelStrictness
from h3core.service.validation import field_errors


def _problem(status: int, detail: str, **extra) -> Response:
    return Response({"detail": detail, **{k: v for k, v in extra.items() if v is not None}}, status_code=status)


def _validation_error(_: Request, exc: ValidationException) -> Response:
    errors = field_errors(exc)
    return _problem(HTTP_422_UNPROCESSABLE_ENTITY, f"invalid {', '.join(e['field'] for e in errors)}", errors=errors)


def _http_error(request: Request, exc: HTTPException) -> Response:
    # The scope's path, not `request.url`: a URL is built from the Host header, which may not parse.
    if videos.owns(request.scope["path"]):  # no route matched (404, 405) under /v1/videos
        return videos.on_http_error(request, exc)
    headers = exc.headers or {}
    body = {"detail": exc.detail}
    if isinstance(exc.extra, dict):
        body.update(exc.extra)
    return Response(body, status_code=exc.status_code, headers=headers)


async def _nosniff(message: Message, scope: Scope) -> None:
    """Every response, errors and 404s included, tells browsers not to guess its type: a video or
    an upload served back is never taken for a page's script or style."""
    if message["type"] == "http.response.start":
        message["headers"] = [*message.get("headers", ()), (b"x-content-type-options", b"nosniff")]


def _internal_error(request: Request, exc: Exception) -> Response:
    log = logging.getLogger("h3core.service")
    if transient(exc) or isinstance(exc, StoreUnavailable):  # the store is away (a restart): not a bug, and it passes
        log.warning("%s %s: the store failed: %s", request.method, request.scope["path"], exc, extra={"error": str(exc)})
        body = {"detail": "the store is unavailable just now; try again"}
        return Response(body, status_code=HTTP_503_SERVICE_UNAVAILABLE, headers={"Retry-After": "2"})
    log.exception("unhandled error on %s %s", request.method, request.scope["path"])
    return _problem(HTTP_500_INTERNAL_SERVER_ERROR, "internal error; the server log has the details")


def create_app(settings: Settings | None = None, service: Service | None = None) -> Litestar:
    """The HTTP service for `settings` (default: `Settings()`): /v1 behind the token guard, /healthz,
    /readyz, /metrics unless `metrics_port` gives it a listener of its own, the console and /schema.
    The app's lifespan runs `service` (default: `build_service(settings)`): its runner, metrics and
    webhook deliveries start with the app and stop with it, and its store is closed after."""
    settings = settings or Settings()
    svc = service or build_service(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            await tg.start(svc.run_runner)
            await tg.start(svc.readiness.run)  # /readyz answers from its first look on
            if svc.runner is None:  # the api role: its files of deleted videos (a runner sweeps its own)
                tg.start_soon(DeletionSweep(svc.store, svc.artifacts, svc.settings.deletion_sweep).run)
            tg.start_soon(svc.keep, "the metrics' follower", lambda: svc.metrics.follow(svc.bus))
            await tg.start(svc.run_webhooks)  # its place in the log is known before a request is taken
            try:
                yield
            finally:
                # Shutdown: running jobs are recorded as interrupted (retried on the next start
                # where the retry policy allows) or left running for it to resume (ComfyUI's
                # prompts); `begin_shutdown` may have begun this.
                svc.stopping = True
                tg.cancel_scope.cancel()
        svc.store.close()

    guard = bearer_guard(settings.api_tokens)  # None without tokens: no guard runs at all
    v1_handlers = [*jobs.handlers, *uploads.handlers, *nodes.handlers, *ops.v1_handlers]
    v1 = Router(
        path="/v1",
        route_handlers=[*with_options(v1_handlers), videos.router],
        guards=[guard] if guard is not None else [],
    )
    cross_site = CrossSitePolicy.of(settings, listen_host=settings.host)
    app = Litestar(
        route_handlers=[v1, *ops.handlers_for(settings), asset, console_router()],
        dependencies={"svc": Provide(lambda: svc, sync_to_thread=False)},
        lifespan=[lifespan],
        plugins=[ModelStrictness()],
        middleware=[CrossSiteGuard(cross_site)],
        before_send=[_nosniff],
        compression_config=compression(),
        cors_config=cross_site.cors(),
        request_class=ServiceRequest,
        logging_config=None,  # the process configures logging (h3core.runtime.logs), not the app it embeds
        request_max_body_size=None,  # bounded per route, naming the limit: `ServiceRequest`
        exception_handlers={
            ValidationException: _validation_error,
            NotAuthorizedException: _http_error,
            HTTPException: _http_error,
            Exception: _internal_error,
        },
        openapi_config=OpenAPIConfig(
            title="h3core",
            version="1",
            description="Long video-generation jobs (MiniMax-H3) that are never stuck, lost or silently half-done.",
            path=SCHEMA_PATH,
            render_plugins=[render_plugin()],
        ),
        debug=False,
    )
    exact_components(app.openapi_schema)
    jobs.document(app.openapi_schema)
    videos.document(app.openapi_schema, settings.openai_models)
    app.state.service = svc
    app.state.body_limits = BodyLimits.of(settings, image_bytes=svc.uploads.limits["image"])
    return app


def create_metrics_app(settings: Settings, svc: Service) -> Litestar:
    """/metrics alone, for its own listener (`metrics_port`); the same Host and Origin rules."""
    return Litestar(
        route_handlers=[ops.metrics],
        dependencies={"svc": Provide(lambda: svc, sync_to_thread=False)},
        middleware=[CrossSiteGuard(CrossSitePolicy.of(settings, listen_host=settings.metrics_host))],
        before_send=[_nosniff],
        openapi_config=None,
        logging_config=None,
        debug=False,
    )
