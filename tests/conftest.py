from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest
from filelock import FileLock

import tests.profiles  # noqa: F401 - registers and loads the Hypothesis profiles
from h3core.adapters.store import MemoryEventStore, SQLiteEventStore
from tests.pgserver import PgServer, running_server
from tests.seaweed import SeaweedServer, running_seaweed
from tests.waiting import stretch

STORE_KINDS = ["sqlite", "memory", "postgres"]


@pytest.fixture(scope="session")
def pg_server() -> Iterator[PgServer]:
    """This worker's own throwaway PostgreSQL (tests/pgserver.py), started on first use (about a
    second). No PostgreSQL on the machine fails the test: the Postgres cases never skip."""
    with running_server() as server:
        yield server


@pytest.fixture
def pg_url(pg_server: PgServer) -> str:
    """A fresh, empty schema on the worker's server, as a store URL."""
    return pg_server.fresh_schema()


@pytest.fixture(scope="session")
def seaweed() -> Iterator[SeaweedServer]:
    """This worker's own throwaway S3 server (SeaweedFS, tests/seaweed.py), started on first use
    (3-6 s). No `weed` binary fails the test: the S3 cases never skip."""
    with running_seaweed() as server:
        yield server


@pytest.fixture
def s3_url(seaweed: SeaweedServer) -> str:
    """A fresh, empty place on the worker's S3 server: `s3://h3-tests/t-<unique>` (a prefix of its own)."""
    return seaweed.fresh_url()


@pytest.fixture
def s3_env(seaweed: SeaweedServer, s3_url: str) -> dict[str, str]:
    """What a child process (`h3core serve`, a worker) needs to keep its artifacts at `s3_url`: the
    AWS_* variables for the server and H3_ARTIFACTS. Merge it into a copy of os.environ."""
    return {**seaweed.env(), "H3_ARTIFACTS": s3_url}


@pytest.fixture
def aws_environ(seaweed: SeaweedServer, monkeypatch: pytest.MonkeyPatch) -> SeaweedServer:
    """The AWS_* variables for the worker's server in this process's environment (a client built
    from the environment alone reaches it); a developer's AWS_PROFILE is set aside."""
    monkeypatch.delenv("AWS_PROFILE", raising=False)
    for name, value in seaweed.env().items():
        monkeypatch.setenv(name, value)
    return seaweed


def open_kind(kind: str, request: pytest.FixtureRequest, tmp_path: Path):
    """A fresh, empty store of `kind` (one of `STORE_KINDS`)."""
    if kind == "sqlite":
        return SQLiteEventStore(tmp_path / "h3.db", durable=False)
    if kind == "postgres":
        from h3core.adapters.store.postgres import PostgresEventStore

        return PostgresEventStore(request.getfixturevalue("pg_url"))
    return MemoryEventStore()


@pytest.fixture(params=STORE_KINDS)
def store(request, tmp_path):
    """Every store implementation, so one contract test covers them all."""
    s = open_kind(request.param, request, tmp_path)
    yield s
    s.close()


@pytest.fixture
def anyio_backend():
    return "asyncio"


def shared_dir(config: pytest.Config, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A folder every xdist worker of this run sees (the run's own temporary root)."""
    base = tmp_path_factory.getbasetemp()
    return base.parent if hasattr(config, "workerinput") else base


@pytest.fixture(autouse=True)
def h3_environment_restored() -> Iterator[None]:
    """No test's H3_* variables outlive it. The CLI's `--config` sets H3_CONFIG in the process's
    environment (for its children), which monkeypatch does not undo where the variable was absent:
    every later test of that worker read that test's TOML file (3 slots on the box page)."""
    before = {k: v for k, v in os.environ.items() if k.startswith("H3_")}
    yield
    for name in [k for k in os.environ if k.startswith("H3_") and k not in before]:
        del os.environ[name]
    os.environ.update(before)


@pytest.fixture(scope="session")
def tiny_model(request, tmp_path_factory) -> Path:
    """One tiny random MiniMax-H3 folder for the whole run, written once for every worker. Tests
    read it; one that changes a model works on a copy."""
    pytest.importorskip("diffusers", reason="the pipeline extra is not installed")
    from h3core.executors.pipeline.model import FACTS_FILE
    from h3core.executors.pipeline.tiny import make_tiny

    root = shared_dir(request.config, tmp_path_factory)
    folder = root / "tiny-model"
    with FileLock(root / "tiny-model.lock"):
        if not (folder / FACTS_FILE).exists():
            make_tiny(folder)
    return folder


def pytest_xdist_auto_num_workers(config: pytest.Config) -> int:
    """`-n auto`: one worker more than the cores (at most 8), or H3_TEST_WORKERS. A worker often
    waits (on a server, a subprocess, a timer), so one more than the cores keeps them busy; more
    than that costs more than it gains here (each worker imports torch and collects the suite),
    measured on 2 cores: 3 workers 5:00, 4 workers 6:00 for the same tests."""
    asked = os.environ.get("H3_TEST_WORKERS")
    return int(asked) if asked else min(8, (os.cpu_count() or 1) + 1)


def pytest_configure(config: pytest.Config) -> None:
    if hasattr(config, "workerinput"):
        # xdist's workers are given COLUMNS=80; the CLI's tables honour COLUMNS and would be cut
        # where a run without workers shows them whole.
        os.environ.pop("COLUMNS", None)
        os.environ.pop("LINES", None)
        # The workers are the parallelism: torch's own threads (one per core in each worker and in
        # each process it starts) would oversubscribe the cores, and OpenMP spins while it waits.
        for name in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(name, "1")


@pytest.hookimpl(hookwrapper=True, tryfirst=True)  # around pytest-timeout's, which reads the mark as it starts
def pytest_runtest_protocol(item: pytest.Item, nextitem: pytest.Item | None):
    # The hang guard (pytest-timeout: the ini's, or a test's own mark) stretches with the load as
    # the waits do (tests/waiting.py), measured as each test starts: a machine loaded since the
    # run began is slower, not red.
    guard = float(item.config.getini("timeout") or 0)
    marked = item.get_closest_marker("timeout")
    seconds = float(marked.args[0] if marked and marked.args else (marked.kwargs.get("timeout", guard) if marked else guard))
    factor = stretch()
    if seconds > 0 and factor > 1:
        item.add_marker(pytest.mark.timeout(seconds * factor), append=False)
    yield


@pytest.hookimpl(tryfirst=True)  # before xdist reads the groups from the markers
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        # Every integration test is slow (a process, a server, a model): `-m "not slow"` leaves them out.
        if "integration" in item.path.parts:
            item.add_marker(pytest.mark.slow)
        # The tests that start Ray run on one worker, one after another (their CPU use is heavy
        # and Ray's ports are the machine's).
        if item.get_closest_marker("ray") is not None:
            item.add_marker(pytest.mark.xdist_group("ray"))
        # An integration module's tests stay on one worker, so its module-scoped server, model or
        # venv is made once per run, not once per worker that happens to get one of its tests.
        elif "integration" in item.path.parts and item.get_closest_marker("xdist_group") is None:
            item.add_marker(pytest.mark.xdist_group(item.path.name))
