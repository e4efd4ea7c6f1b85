"""Shared by every bench: what machine it ran on, tables, percentiles, timing, the command line, a
throwaway PostgreSQL and S3 server. Imported as `bench.common` (benches run as `python -m bench.<kind>.<name>`)."""

from __future__ import annotations

import argparse
import os
import platform
import shlex
import sqlite3
import statistics
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from importlib import metadata
from pathlib import Path

from rich import box
from rich.console import Console
from rich.table import Table

ROOT = Path(__file__).resolve().parents[1]  # the repository (this checkout)


def export(ref: str, workdir: Path) -> Path:
    """The h3core package of `ref`, unpacked under `workdir` (git archive: the repository is left as it is)."""
    sha = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True, capture_output=True, text=True)
    path = workdir / f"h3core-{sha.stdout.strip()}"
    if not path.exists():
        path.mkdir(parents=True)
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "h3core"], check=True, capture_output=True)
        subprocess.run(["tar", "-x", "-C", str(path)], input=archive.stdout, check=True)
    return path


# Markdown tables: readable in a terminal and pasteable into a README as they are. Text is printed
# as it is: no rich markup ("[...]" in a prompt), no emoji codes (":100:" in "jobs.py:100:get_job").
console = Console(width=160, highlight=False, soft_wrap=True, markup=False, emoji=False)


def _read(path: str | Path) -> str | None:
    try:
        return Path(path).read_text().strip()
    except OSError:
        return None


def cpu_model() -> str:
    for line in (_read("/proc/cpuinfo") or "").splitlines():
        if line.startswith("model name"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def mem_total_gib() -> float | None:
    for line in (_read("/proc/meminfo") or "").splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) / 1024 / 1024
    return None


def disk_of(path: str | Path) -> str:
    """The filesystem holding `path`: device, type, mount point, and whether the kernel calls it rotational."""
    p = Path(path).resolve()
    while not p.exists():
        p = p.parent
    dev = os.stat(p).st_dev
    major, minor = os.major(dev), os.minor(dev)
    best = None
    for line in (_read("/proc/self/mountinfo") or "").splitlines():
        left, _, right = line.partition(" - ")
        f = left.split()
        if f[2] != f"{major}:{minor}":
            continue
        fstype, source = right.split()[:2]
        mount = f[4]
        if best is None or len(mount) > len(best[2]):
            best = (source, fstype, mount, f[5])
    rot = _read(f"/sys/dev/block/{major}:{minor}/queue/rotational")
    if rot is None:  # a partition: ask its parent device
        rot = _read(f"/sys/dev/block/{major}:{minor}/../queue/rotational")
    model = _read(f"/sys/dev/block/{major}:{minor}/device/model") or _read(f"/sys/dev/block/{major}:{minor}/../device/model")
    if best is None:
        return f"device {major}:{minor}"
    source, fstype, mount, opts = best
    kind = {"0": "non-rotational", "1": "rotational per kernel"}.get(rot or "", "rotational: unknown")
    extra = f", model {model}" if model else ""
    return f"{source} ({fstype}, mounted at {mount}, {opts}; {kind}{extra})"


def version(dist: str) -> str:
    try:
        return metadata.version(dist)
    except metadata.PackageNotFoundError:
        return "?"


def machine_lines(db_dir: str | Path) -> list[tuple[str, str]]:
    cores = os.cpu_count()
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = cores
    mem = mem_total_gib()
    return [
        ("CPU", f"{cpu_model()} ({cores} logical cores, {usable} usable by this process)"),
        ("Memory", f"{mem:.1f} GiB" if mem else "?"),
        ("OS", f"{platform.system()} {platform.release()}"),
        ("Python", f"{platform.python_implementation()} {platform.python_version()}"),
        ("SQLite", f"{sqlite3.sqlite_version} (library linked by Python's sqlite3)"),
        ("Packages", f"h3core {version('h3core')}, pydantic {version('pydantic')}, anyio {version('anyio')}"),
        ("DB directory", str(Path(db_dir).resolve())),
        ("Disk", disk_of(db_dir)),
        ("Load at start", load_line()),
    ]


def load_line() -> str:
    """Load averages and the busiest other processes: figures measured on a busy machine are low."""
    one, five, fifteen = os.getloadavg()
    others = []
    me = os.getpid()
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == me:
            continue
        stat = _read(d / "stat")
        cmdline = (_read(d / "cmdline") or "").replace("\0", " ").strip()
        if not stat or not cmdline:  # gone, or a kernel thread
            continue
        if stat.rpartition(")")[2].split()[0] == "R":
            others.append(cmdline[:60])
    running = f"; other processes running now: {'; '.join(sorted(others))}" if others else "; no other process running now"
    return f"{one:.2f} / {five:.2f} / {fifteen:.2f} (1/5/15 min){running}"


def print_load_at_end() -> None:
    console.print(f"load at end: {load_line()}")


# The command print_machine shows: set by `parse`, so a bench called as `main([...])` (the smoke
# tests) names its own arguments rather than pytest's.
_command: list[str] = []


def parse(parser: argparse.ArgumentParser, argv: Sequence[str] | None, module: str) -> argparse.Namespace:
    """`parser.parse_args(argv)`, remembering `python -m MODULE ARGS` for the machine table."""
    args = parser.parse_args(argv)
    _command[:] = ["python", "-m", module, *(sys.argv[1:] if argv is None else argv)]
    return args


def print_machine(db_dir: str | Path, title: str) -> None:
    command = shlex.join(_command or [Path(sys.executable).name, *sys.argv])
    t = table(title, ["machine", ""], caption=f"command: `{command}`", left=2)
    for k, v in machine_lines(db_dir):
        t.add_row(k, v)
    show(t)


def table(title: str, columns: Sequence[str], *, caption: str | None = None, left: int = 1) -> Table:
    """A markdown table; `show` prints it under `title`, with `caption` (what the figures mean) below."""
    t = Table(box=box.MARKDOWN)
    for i, c in enumerate(columns):
        t.add_column(c, justify="left" if i < left else "right")
    t.h3_title, t.h3_caption = title, caption  # type: ignore[attr-defined]
    return t


def show(t: Table) -> None:
    console.print(f"### {t.h3_title}\n")  # type: ignore[attr-defined]
    console.print(t)
    if t.h3_caption:  # type: ignore[attr-defined]
        console.print(f"{t.h3_caption}\n")  # type: ignore[attr-defined]


def pct(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100), nearest-rank on sorted values."""
    if not values:
        return float("nan")
    s = sorted(values)
    k = max(0, min(len(s) - 1, round(q / 100 * (len(s) - 1))))
    return s[k]


def ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f}"


def rate(n: float, seconds: float) -> str:
    return f"{n / seconds:,.0f}" if seconds > 0 else "inf"


def median(values: Sequence[float]) -> float:
    return statistics.median(values) if values else float("nan")


class Timer:
    def __enter__(self) -> Timer:
        self.cpu0 = time.process_time()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.s = time.perf_counter() - self.t0
        self.cpu = time.process_time() - self.cpu0


def wait_for(predicate, timeout: float) -> bool:
    """Poll `predicate` every 20 ms until it holds (True) or `timeout` seconds pass (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if predicate():
            return True
        time.sleep(0.02)
    return False


@contextmanager
def _given_or_started(server: object | None, start: Callable[[], AbstractContextManager]) -> Iterator:
    if server is not None:
        yield server
        return
    with start() as started:
        yield started


def postgres(server: object | None = None) -> AbstractContextManager:
    """`server` when given (the suite's own, tests/pgserver.py), else a throwaway PostgreSQL for this run."""
    from tests.pgserver import running_server

    return _given_or_started(server, running_server)


def seaweed(server: object | None = None) -> AbstractContextManager:
    """`server` when given (the suite's own, tests/seaweed.py), else a throwaway S3 server (SeaweedFS) for this run."""
    from tests.seaweed import running_seaweed

    return _given_or_started(server, running_seaweed)
