"""`h3core serve`: the HTTP service for h3-console (Litestar on uvicorn).

The command builds the settings (h3core/cli/flags.py makes its flags from them), the service and
the app; h3core/service/hosting.py serves them. The runner role serves no HTTP: the jobs run here.
"""

from __future__ import annotations

import functools
import os
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
from h3core.service import hosting

# The runner role freezes what start-up made as the HTTP roles do (tests/unit/cli/test_logs.py).
_freeze_startup_objects = hosting.freeze_startup_objects


@app.command()
@settings_flags()  # every setting but the secrets
def serve(given: dict[str, Any]) -> None:
    """Serve the HTTP API (OpenAPI at /schema). Tokens come from H3_API_TOKENS only, the webhook secret from
    H3_WEBHOOK_SECRET only (never a flag)."""
    require_extra("service", "litestar", "uvicorn", "prometheus_client")
    from h3core.service.app import build_service, create_app

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
    try:
        if application is None:  # the runner role
            _run_jobs(service)
            return
        console_err().print(_banner(settings))
        hosting.host(service, application)
    except hosting.HostingError as exc:
        fail(str(exc))
    finally:
        if lock is not None:
            lock.release()
    if isinstance(service.fatal, StoreUnavailable):
        fail(f"h3core stopped, the store is unusable: {service.fatal}", EXIT_DATA)
    if service.fatal is not None:  # a bug: the log has its traceback
        fail(f"h3core stopped, it cannot do its job: {service.fatal}", EXIT_DATA)


def _banner(settings: Settings) -> str:
    """One line on where the service listens, what it runs on and who may call it."""
    auth = f"{len(settings.api_tokens)} API token(s)" if settings.api_tokens else "no authentication (loopback only)"
    runs = "runner in another process" if settings.role == "api" else f"executor {settings.executor}"
    metrics = (
        f"  metrics http://{settings.metrics_host}:{settings.metrics_port}/metrics" if settings.metrics_port is not None else ""
    )
    return (
        f"h3core: http://{settings.host}:{settings.port}  store {settings.db}  {runs}  {auth}  ({hosting.server_impl()})"
        + metrics
    )


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
            backend_options=hosting.loop_options(),
        )
    except StoreUnavailable as exc:
        fail(f"h3core runner stopped, the store is unusable: {exc}", EXIT_DATA)
    finally:
        svc.store.close()
    console_err().print(f"h3core runner: stopped ({how})")
