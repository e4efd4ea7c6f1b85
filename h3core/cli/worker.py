"""Running jobs from the command line: `enqueue` a job, run a `worker` until SIGTERM.

The worker runs the executor `serve` is configured to run (the same settings and the same
`make_executor`); `--executor fake` when the fake is wanted.
"""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import AsyncIterator, Callable, Coroutine, Sequence
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated, Any

import anyio
import typer
from anyio.streams.memory import MemoryObjectReceiveStream
from pydantic import ValidationError

from h3core.adapters.profiles import ProfileError
from h3core.adapters.store.nodes import NodeTaken
from h3core.cli.app import app
from h3core.cli.capacity import ProfileOption, profile_named
from h3core.cli.common import (
    EXIT_DATA,
    EXIT_LOCKED,
    DbOption,
    console_err,
    fail,
    first_error,
    open_store,
    require_extra,
    take_runner_lock,
    ts,
)
from h3core.cli.flags import settings_flags
from h3core.cli.replay import fields
from h3core.domain.events import (
    Event,
)
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.runtime import IdempotencyMismatch, Refused, Runner, Submissions
from h3core.runtime.fleet import FleetAdmission
from h3core.runtime.logs import configure as configure_logging
from h3core.runtime.node import build_node, service_admission
from h3core.runtime.settings import Settings, SettingsError
from h3core.runtime.store_retry import StoreUnavailable


@app.command()
def enqueue(
    prompt: Annotated[str, typer.Option("--prompt", help="What to generate.")],
    db: DbOption = Path("h3core.db"),
    steps: Annotated[int, typer.Option(help="Denoising steps.")] = 50,
    frames: Annotated[int, typer.Option(help="Frames (24 fps).")] = 124,
    width: Annotated[int, typer.Option(help="Width in pixels, a multiple of 32.")] = 1344,
    height: Annotated[int, typer.Option(help="Height in pixels, a multiple of 32.")] = 768,
    seed: Annotated[int, typer.Option(help="Random seed.")] = 0,
    priority: Annotated[int, typer.Option(help="Higher runs first.")] = 0,
    max_attempts: Annotated[
        int,
        typer.Option(envvar="H3_MAX_ATTEMPTS", help="The job's retry policy: at most this many attempts."),
    ] = 2,
    idempotency_key: Annotated[str | None, typer.Option(help="Submitting the same key again returns the same job.")] = None,
    profile: ProfileOption = None,
) -> None:
    """Store a job for a worker to run, and print its id. No runner is started."""
    try:
        request = GenerationRequest(prompt=prompt, steps=steps, frames=frames, width=width, height=height, seed=seed)
        retry = RetryPolicy(max_attempts=max_attempts)
    except ValidationError as exc:
        fail(f"invalid job: {first_error(exc)}")
    try:  # judged as the service judges a submit to this store: what its runners state they can run
        settings = Settings(db=db, role="api", max_attempts=retry.max_attempts, capacity_profile=profile)
    except ValidationError as exc:
        fail(f"invalid setting: {first_error(exc)}")
    with open_store(db, create=True) as store:
        try:
            contract = service_admission(store, settings)
        except ProfileError as exc:
            fail(str(exc))
        if isinstance(contract, FleetAdmission):
            contract.refresh()
        submissions = Submissions(store, settings.runner_config(), admission=contract)  # no writer task: one append
        try:
            submit = functools.partial(submissions.submit, request, priority=priority, idempotency_key=idempotency_key)
            submitted = anyio.run(submit)
        except (Refused, IdempotencyMismatch) as exc:
            fail(str(exc))
        state = submitted.state
    for warning in state.warnings:
        console_err().print(f"warning: {warning}")
    typer.echo(state.job_id)


# -- the worker -----------------------------------------------------------------------------------


def _log_event(e: Event) -> None:
    """One plain line per event, flushed at once (the worker's log may be a pipe or a file)."""
    print(f"{ts(e.at)} {e.job_id} #{e.seq} {e.type} {fields(e)}".rstrip(), flush=True)


async def _print_events(events: AsyncIterator[Event]) -> None:
    async for e in events:
        _log_event(e)


async def serve_runner(
    runner: Runner, *, verbose: bool, name: str = "worker", beside: Sequence[Callable[[], Coroutine[Any, Any, object]]] = ()
) -> str:
    """Run until SIGTERM or SIGINT; return the signal's name. Cancelling the runner is its shutdown.
    `beside`: tasks that run as long as the runner (webhook deliveries). Raises `StoreUnavailable`
    where the runner stopped because the store is unusable."""
    try:
        return await _serve_runner(runner, verbose=verbose, name=name, beside=beside)
    except* StoreUnavailable as group:
        raise StoreUnavailable.within(group) from None


async def _serve_runner(
    runner: Runner, *, verbose: bool, name: str, beside: Sequence[Callable[[], Coroutine[Any, Any, object]]]
) -> str:
    received: list[str] = []
    with anyio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        async with AsyncExitStack() as stack:
            events = await stack.enter_async_context(runner.bus.subscribe()) if verbose else None
            async with anyio.create_task_group() as printer:
                if events is not None:
                    printer.start_soon(_print_events, events)
                with anyio.CancelScope() as run_scope:
                    async with anyio.create_task_group() as tg:

                        async def stop_on_signal() -> None:
                            async for signum in signals:
                                received.append(signal.Signals(signum).name)
                                console_err().print(
                                    f"{name}: {received[-1]} received, stopping "
                                    "(running jobs are recorded as interrupted, or left running for the next start to resume)"
                                )
                                run_scope.cancel()
                                return

                        tg.start_soon(stop_on_signal)
                        for task in beside:
                            tg.start_soon(task)
                        await tg.start(runner.run)
                        console_err().print(f"{name}: ready")
                printer.cancel_scope.cancel()
            # What the runner wrote while stopping (the interrupted attempts), not yet printed.
            assert events is None or isinstance(events, MemoryObjectReceiveStream)  # what the bus hands out
            while events is not None:
                try:
                    e = events.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                _log_event(e)
    return received[0] if received else "cancel"


@app.command()
@settings_flags(
    "executor",
    "artifacts",
    "slots",
    "stall_timeout",
    "fake_step_seconds",
    "fake_window_seconds",
    "max_attempts",
    "poll_interval",
    "model_dir",
    "device",
    "store_retry",
    "log_format",
    "log_level",
    help={  # where the worker's flag says more than the setting's description
        "executor": "pipeline, comfyui or fake, as `serve` runs it.",
        "max_attempts": "Retry policy of jobs submitted through this runner. Jobs already stored keep the "
        "policy recorded when they were enqueued (see `enqueue --max-attempts`).",
        "config": "A TOML settings file (the names of `serve`'s options).",
    },
)
def worker(
    given: dict[str, Any],
    db: DbOption = Path("h3core.db"),
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print one line per event written.")] = False,
    profile: ProfileOption = None,
) -> None:
    """Run the store's queued jobs until SIGTERM or SIGINT (a graceful stop), with the executor
    `serve` would run: the same settings (these flags, every other `serve` setting from its H3_*
    variable or the --config file). `--executor fake` runs the fake."""
    # The flags as given (Settings validates them), with those the worker names its own way.
    given = {**given, "db": db} | ({"capacity_profile": profile} if profile is not None else {})
    try:
        settings = Settings(**given)
        settings.runner_config()  # settings that cannot run together stop it here (SettingsError)
        configure_logging(settings.log_format, settings.log_level)
    except ValidationError as exc:
        fail(f"invalid setting: {first_error(exc)}")
    except SettingsError as exc:
        fail(str(exc))
    profile_named(settings.capacity_profile)  # a profile that cannot be read stops it here, before the lock
    lock = take_runner_lock(settings.db)  # before the executor: loading a model takes a while
    try:
        with open_store(settings.db, create=True, **settings.store_options()) as store:
            if settings.webhook_secret is not None or settings.webhook_endpoints:  # it runs the jobs: it delivers their webhooks
                require_extra("service", "httpx", "standardwebhooks")
            try:
                node = build_node(settings, store=store)
            except OSError as exc:
                fail(f"cannot use {exc.filename or settings.artifacts}: {exc.strerror or exc}")
            except (SettingsError, ProfileError) as exc:
                fail(str(exc))
            runner = node.runner
            assert runner is not None  # a worker runs its jobs
            console_err().print(
                f"worker: pid {os.getpid()}, store {settings.db}, executor {settings.executor}, artifacts {settings.artifacts}, "
                f"slots {runner.slot_count()}; stop with SIGTERM or Ctrl-C"
            )
            beside = [node.webhooks.run] if node.webhooks is not None else []
            try:
                how = anyio.run(functools.partial(serve_runner, runner, verbose=verbose, beside=beside))
            except StoreUnavailable as exc:
                fail(f"worker stopped, the store is unusable: {exc}", EXIT_DATA)
            except NodeTaken as exc:  # PostgreSQL: a live process already runs under this node id
                fail(str(exc), EXIT_LOCKED)
            console_err().print(f"worker: stopped ({how})")
    finally:
        if lock is not None:
            lock.release()
