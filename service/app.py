"""The Litestar application for h3-console: a thin shell over the runner and its stores."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime

import anyio
import anyio.abc
from litestar import Litestar, Request, Response, Router
from litestar.di import Provide
from litestar.exceptions import HTTPException, NotAuthorizedException, ValidationException
from litestar.openapi import OpenAPIConfig
from litestar.openapi.plugins import SwaggerRenderPlugin
from litestar.status_codes import HTTP_413_REQUEST_ENTITY_TOO_LARGE, HTTP_422_UNPROCESSABLE_ENTITY, HTTP_500_INTERNAL_SERVER_ERROR

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.profiles import load_profile
from h3core.adapters.store.sqlite import SQLiteEventStore
from h3core.adapters.uploads import DEFAULT_LIMITS, LocalUploadStore
from h3core.bus import EventBus
from h3core.domain.capacity import CapacityPolicy
from h3core.runner import Runner
from h3core.tail import StoreTail
from service.auth import bearer_guard
from service.executors import make_executor
from service.metrics import Metrics
from service.settings import Settings
from service.strictness import ModelStrictness


@dataclass
class Service:
    """Everything a request handler may touch, made once per process."""

    settings: Settings
    store: SQLiteEventStore
    artifacts: LocalArtifactStore
    uploads: LocalUploadStore
    policy: CapacityPolicy
    runner: Runner  # in the api role, only for submitting and cancelling: its jobs run elsewhere
    metrics: Metrics
    bus: EventBus  # every event this process learns of: the runner's, or the store tail's
    tail: StoreTail | None = None  # api role: what a runner process stores reaches `bus` through it
    started: datetime = field(default_factory=lambda: datetime.now(UTC))
    stopping: bool = False
    _runner_scope: anyio.CancelScope | None = None
    _loop: asyncio.AbstractEventLoop | None = None

    def begin_shutdown(self) -> None:
        """Stop now (SIGTERM): stop admitting, stop the runner, which records running jobs as
        interrupted, then end the live streams, so open connections do not hold the stop up.
        Safe to call from a signal handler."""
        self.stopping = True
        if self._loop is not None and self._runner_scope is not None:
            self._loop.call_soon_threadsafe(self._runner_scope.cancel)

    async def run_runner(self, *, task_status: anyio.abc.TaskStatus[None] = anyio.TASK_STATUS_IGNORED) -> None:
        self._loop = asyncio.get_running_loop()
        with anyio.CancelScope() as scope:
            self._runner_scope = scope
            if self.tail is None:
                await self.runner.run(task_status=task_status)
            else:
                async with anyio.create_task_group() as tg:
                    await tg.start(self.tail.run)
                    await self.runner.admit_only(task_status=task_status)
        self.bus.close()  # after the runner's last events (the interruptions) went out



def build_service(settings: Settings) -> Service:
    store = SQLiteEventStore(settings.db)
    artifacts = LocalArtifactStore(settings.artifacts)
    uploads = LocalUploadStore(settings.uploads, limits={k: min(v, settings.max_upload_bytes) for k, v in DEFAULT_LIMITS.items()})
    policy = CapacityPolicy(load_profile(settings.capacity_profile))
    if settings.role == "api":  # no executor here: the runner process has it
        runner = Runner(store, None, settings.runner_config(), admission=policy)  # type: ignore[arg-type]
        bus = EventBus()
        tail = StoreTail(store, bus, interval_s=settings.tail_interval)
        return Service(settings, store, artifacts, uploads, policy, runner, Metrics(store), bus, tail)
    executor = make_executor(settings, artifacts, uploads)
    runner = Runner(store, executor, settings.runner_config(), admission=policy)
    return Service(settings, store, artifacts, uploads, policy, runner, Metrics(store, executor), runner.bus)


def _problem(status: int, detail: str, **extra) -> Response:
    return Response({"detail": detail, **{k: v for k, v in extra.items() if v is not None}}, status_code=status)


# Header parameters are named in errors as the client sends them, not as Python spells them.
_HEADERS = {"idempotency_key": "Idempotency-Key", "last_event_id": "Last-Event-ID", "content_type": "Content-Type"}


def _validation_error(_: Request, exc: ValidationException) -> Response:
    errors = [
        {"field": _HEADERS.get(str(e.get("key")), str(e.get("key") or "body")), "message": str(e.get("message"))}
        for e in (exc.extra if isinstance(exc.extra, list) else [])
    ]
    if not errors:
        errors = [{"field": "body", "message": exc.detail or "invalid request"}]
    named = ", ".join(e["field"] for e in errors) or "the request"
    return _problem(HTTP_422_UNPROCESSABLE_ENTITY, f"invalid {named}", errors=errors or None)


def _http_error(_: Request, exc: HTTPException) -> Response:
    if exc.status_code == HTTP_413_REQUEST_ENTITY_TOO_LARGE:
        return _problem(exc.status_code, exc.detail or "request body too large")
    headers = exc.headers or {}
    body = {"detail": exc.detail}
    if isinstance(exc.extra, dict):
        body.update(exc.extra)
    return Response(body, status_code=exc.status_code, headers=headers)


def _internal_error(request: Request, exc: Exception) -> Response:
    request.logger.exception("unhandled error on %s %s", request.method, request.url.path)
    return _problem(HTTP_500_INTERNAL_SERVER_ERROR, "internal error; the server log has the details")


def create_app(settings: Settings | None = None, service: Service | None = None) -> Litestar:
    from service.routes import jobs, ops, uploads

    settings = settings or Settings()
    svc = service or build_service(settings)

    @asynccontextmanager
    async def lifespan(app: Litestar) -> AsyncIterator[None]:
        async with anyio.create_task_group() as tg:
            await tg.start(svc.run_runner)
            tg.start_soon(svc.metrics.follow, svc.bus)
            try:
                yield
            finally:
                # Shutdown: running jobs are recorded as interrupted (and retried on the next
                # start where the retry policy allows); `begin_shutdown` may have begun this.
                svc.stopping = True
                tg.cancel_scope.cancel()
        svc.store.close()

    guard = bearer_guard(settings.api_tokens)  # None without tokens: no guard runs at all
    v1 = Router(
        path="/v1",
        route_handlers=[*jobs.handlers, *uploads.handlers, *ops.v1_handlers],
        guards=[guard] if guard is not None else [],
    )
    app = Litestar(
        route_handlers=[v1, *ops.handlers],
        dependencies={"svc": Provide(lambda: svc, sync_to_thread=False)},
        lifespan=[lifespan],
        plugins=[ModelStrictness()],
        request_max_body_size=settings.max_body_bytes,
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
            path="/schema",
            render_plugins=[SwaggerRenderPlugin(path="/")],
        ),
        debug=False,
    )
    app.state.service = svc
    return app
