"""Running jobs from the command line: `enqueue` a job, run a `worker` until SIGTERM."""

from __future__ import annotations

import functools
import os
import signal
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path
from typing import Annotated

import anyio
import typer
from pydantic import ValidationError

from h3core.adapters.artifacts import LocalArtifactStore
from h3core.adapters.profiles import builtin_profiles
from h3core.cli.app import app
from h3core.cli.capacity import ProfileOption, admission, profile_named
from h3core.cli.common import (
    EXIT_DATA,
    DbOption,
    console_err,
    fail,
    first_error,
    open_store,
    take_runner_lock,
    ts,
)
from h3core.cli.replay import fields
from h3core.contracts import CapabilityFile, LiveContract, capabilities_path
from h3core.domain.events import (
    Event,
)
from h3core.domain.request import GenerationRequest
from h3core.domain.retry import RetryPolicy
from h3core.executors.fake import FakeExecutor, FakePlan
from h3core.logs import LogFormat, LogLevel
from h3core.logs import configure as configure_logging
from h3core.runner import IdempotencyMismatch, Refused, Runner, RunnerConfig
from h3core.store_retry import StoreUnavailable


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
        request = GenerationRequest(
            prompt=prompt, steps=steps, frames=frames, width=width, height=height, seed=seed
        )
        retry = RetryPolicy(max_attempts=max_attempts)
    except ValidationError as exc:
        fail(f"invalid job: {first_error(exc)}")
    with open_store(db, create=True) as store:
        runner = Runner(store, None, RunnerConfig(retry=retry), admission=admission(db, profile))  # submits only
        try:
            state = anyio.run(
                functools.partial(runner.submit, request, priority=priority, idempotency_key=idempotency_key)
            )
        except (Refused, IdempotencyMismatch) as exc:
            fail(str(exc))
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


async def serve_runner(runner: Runner, *, verbose: bool, name: str = "worker") -> str:
    """Run until SIGTERM or SIGINT; return the signal's name. Cancelling the runner is its shutdown.
    Raises `StoreUnavailable` where the runner stopped because the store is unusable."""
    try:
        return await _serve_runner(runner, verbose=verbose, name=name)
    except* StoreUnavailable as group:
        raise StoreUnavailable.within(group) from None


async def _serve_runner(runner: Runner, *, verbose: bool, name: str) -> str:
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
                        await tg.start(runner.run)
                        console_err().print(f"{name}: ready")
                printer.cancel_scope.cancel()
            # What the runner wrote while stopping (the interrupted attempts), not yet printed.
            while events is not None:
                try:
                    e = events.receive_nowait()
                except (anyio.WouldBlock, anyio.EndOfStream, anyio.ClosedResourceError):
                    break
                _log_event(e)
    return received[0] if received else "cancel"


@app.command()
def worker(
    db: DbOption = Path("h3core.db"),
    artifacts: Annotated[Path, typer.Option(envvar="H3_ARTIFACTS", help="Where finished videos go.")] = Path(
        "artifacts"
    ),
    slots: Annotated[int, typer.Option(min=1, max=256, help="Jobs run at once.")] = 1,
    stall_timeout: Annotated[
        float, typer.Option(envvar="H3_STALL_TIMEOUT", help="Seconds without progress before an attempt is stalled.")
    ] = 600.0,
    fake_step_seconds: Annotated[
        float, typer.Option(envvar="H3_FAKE_STEP_SECONDS", min=0, help="The fake executor's time per step.")
    ] = 0.5,
    max_attempts: Annotated[
        int,
        typer.Option(
            envvar="H3_MAX_ATTEMPTS",
            help="Retry policy of jobs submitted through this runner. Jobs already stored keep the "
            "policy recorded when they were enqueued (see `enqueue --max-attempts`).",
        ),
    ] = 2,
    poll_interval: Annotated[float, typer.Option(help="Seconds between looks for work other processes stored.")] = 0.5,
    verbose: Annotated[bool, typer.Option("--verbose", "-v", help="Print one line per event written.")] = False,
    profile: ProfileOption = None,
    store_retry: Annotated[
        float, typer.Option(envvar="H3_STORE_RETRY", help="Seconds a failing store is retried before the worker exits.")
    ] = 30.0,
    log_format: Annotated[LogFormat, typer.Option(envvar="H3_LOG_FORMAT", help="Log records as text or JSON lines.")] = "text",
    log_level: Annotated[LogLevel, typer.Option(envvar="H3_LOG_LEVEL", help="Least level logged.")] = "info",
) -> None:
    """Run queued jobs with the fake executor until SIGTERM or SIGINT (a graceful stop)."""
    configure_logging(log_format, log_level)
    try:
        config = RunnerConfig(
            slots=slots,
            stall_timeout_s=stall_timeout,
            poll_interval_s=poll_interval,
            retry=RetryPolicy(max_attempts=max_attempts),
            store_retry_s=store_retry,
        )
    except ValidationError as exc:
        fail(f"invalid worker setting: {first_error(exc)}")
    lock = take_runner_lock(db)
    try:
        with open_store(db, create=True) as store:
            try:
                artifact_store = LocalArtifactStore(artifacts)
            except OSError as exc:
                fail(f"cannot use {artifacts} for artifacts: {exc.strerror or exc}")
            executor = FakeExecutor(artifact_store, default=FakePlan(step_seconds=fake_step_seconds))
            contract = LiveContract(executor.capabilities, builtin_profiles(), profile=profile_named(profile))
            runner = Runner(store, executor, config, admission=contract, board=CapabilityFile(capabilities_path(db)), artifacts=artifact_store)
            console_err().print(
                f"worker: pid {os.getpid()}, store {db}, artifacts {artifacts}, slots {slots}; "
                "stop with SIGTERM or Ctrl-C"
            )
            try:
                how = anyio.run(functools.partial(serve_runner, runner, verbose=verbose))
            except StoreUnavailable as exc:
                fail(f"worker stopped, the store is unusable: {exc}", EXIT_DATA)
            console_err().print(f"worker: stopped ({how})")
    finally:
        lock.release()

