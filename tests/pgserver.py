"""A throwaway PostgreSQL server for the tests and benches: initdb into a temporary folder, run on
127.0.0.1 on a free port with its socket in that folder, thrown away at the end.

PostgreSQL refuses to run as root: as root the server runs as `postgres` (the user Debian's
package makes) or else `nobody`, owning its folder. Durability is off (`fsync`, `synchronous_commit`,
`full_page_writes`): a test's database dies with the test run. Binaries: `H3_PG_BIN`, else the
newest /usr/lib/postgresql/*/bin, else `initdb` on PATH. None found raises `NoPostgres` (the
suite fails loudly: `./scripts/test` installs postgresql-15 with apt where it is missing).
"""

from __future__ import annotations

import contextlib
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

__all__ = ["NoPostgres", "PgServer", "pg_bin", "running_server"]


class NoPostgres(RuntimeError):
    """No PostgreSQL binaries on this machine."""


def pg_bin() -> Path:
    if given := os.environ.get("H3_PG_BIN"):
        return Path(given)
    versions = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"), key=lambda p: int(p.parent.parent.name))
    if versions:
        return versions[-1].parent
    if found := shutil.which("initdb"):
        return Path(found).parent
    raise NoPostgres(
        "no PostgreSQL binaries (initdb, postgres): install postgresql-15 (`apt-get install postgresql-15`; "
        "./scripts/test does) or point H3_PG_BIN at its bin folder"
    )


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _unprivileged() -> pwd.struct_passwd | None:
    """Whom the server runs as: None (ourselves) unless we are root."""
    if os.geteuid() != 0:
        return None
    for name in ("postgres", "nobody"):
        with contextlib.suppress(KeyError):
            return pwd.getpwnam(name)
    raise NoPostgres("running as root, and neither a `postgres` nor a `nobody` user to run PostgreSQL as")


@dataclass
class PgServer:
    folder: Path
    port: int
    user: str
    # How to run its pg_ctl (a fault test restarts the server): the binaries, and as whom.
    bin: Path | None = None
    runas: pwd.struct_passwd | None = None
    options: str = ""

    def url(self, dbname: str = "postgres", schema: str | None = None) -> str:
        url = f"postgresql://{self.user}@127.0.0.1:{self.port}/{dbname}"
        # A schema per test: isolation at the cost of one statement, where a database costs ~100 ms.
        return url + (f"?options=-csearch_path%3D{schema}" if schema else "")

    def fresh_schema(self) -> str:
        """A new, empty schema's URL (its tables are the store's own; the server is thrown away whole)."""
        import psycopg

        name = "t_" + uuid.uuid4().hex[:16]
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f"CREATE SCHEMA {name}")
        return self.url(schema=name)

    # -- faults, for the tests of what a node does when its server goes away ---------------------

    def _pg_ctl(self, *args: str | Path) -> None:
        assert self.bin is not None, "a server started by running_server"
        env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
        done = subprocess.run(
            [self.bin / "pg_ctl", "-D", self.folder / "data", *args],
            preexec_fn=_as(self.runas),
            env=env,
            cwd=self.folder,
            capture_output=True,
            text=True,
        )
        if done.returncode:
            raise RuntimeError(f"pg_ctl {' '.join(map(str, args))} failed: {done.stderr.strip() or done.stdout.strip()}")

    def stop(self, mode: str = "fast") -> None:
        """Stop the server (`fast`: sessions ended, a clean shutdown; `immediate`: as a crash)."""
        self._pg_ctl("-m", mode, "-w", "-t", "60", "stop")

    def start(self) -> None:
        """Start it again on the same port and folder (after `stop`)."""
        self._pg_ctl("-l", self.folder / "log", "-o", self.options, "-w", "-t", "60", "start")

    def restart(self, mode: str = "fast", down_s: float = 0.0) -> None:
        """Stop the server as `mode` says, stay down `down_s`, and start it again."""
        import time

        self.stop(mode)
        time.sleep(down_s)
        self.start()

    def postmaster_pid(self) -> int:
        return int((self.folder / "data" / "postmaster.pid").read_text().split()[0])

    def pause(self) -> None:
        """Freeze the postmaster (SIGSTOP): new connections hang, sessions already open go on."""
        os.kill(self.postmaster_pid(), signal.SIGSTOP)

    def resume(self) -> None:
        os.kill(self.postmaster_pid(), signal.SIGCONT)

    def terminate_backends(self, dbname: str = "postgres") -> int:
        """End every other session of the server's databases (`pg_terminate_backend`); how many."""
        import psycopg

        with psycopg.connect(self.url(dbname), autocommit=True) as conn:
            rows = conn.execute(
                "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
                "WHERE pid <> pg_backend_pid() AND backend_type = 'client backend'"
            ).fetchall()
        return sum(1 for (ok,) in rows if ok)

    @staticmethod
    def empty(url: str) -> None:
        """Empty the store at `url` (its tables kept, positions restarted): cheaper than a fresh
        schema, for a property test's every example. Triggers are off for it (replica role), so the
        append-only guard lets the test's own cleanup through."""
        import psycopg

        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("SET session_replication_role = replica")
            conn.execute("TRUNCATE events, jobs, positions, deliveries RESTART IDENTITY")


def _as(user: pwd.struct_passwd | None):
    if user is None:
        return None

    def drop() -> None:
        os.setgid(user.pw_gid)
        os.setgroups([])
        os.setuid(user.pw_uid)

    return drop


COMPLETE = "h3core-template-complete"


def _template(bin_: Path, user: pwd.struct_passwd | None, name: str) -> Path:
    """An initdb'd data folder, made once per machine and user (initdb takes seconds on a busy box;
    a copy takes a fraction of one): servers start from copies of it."""
    from filelock import FileLock

    version = (bin_ / "initdb").resolve().parent.parent.name
    cache = Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "h3core"
    cache.mkdir(parents=True, exist_ok=True)
    template = cache / f"pgdata-{version}-{name}"
    with FileLock(cache / f"pgdata-{version}-{name}.lock"):
        if (template / COMPLETE).exists():
            return template
        folder = Path(tempfile.mkdtemp(prefix="h3pg-initdb-"))  # where the server's user can reach (not under /root)
        try:
            if user is not None:
                os.chown(folder, user.pw_uid, user.pw_gid)
            done = subprocess.run(
                [
                    bin_ / "initdb",
                    "-D",
                    folder / "data",
                    "-U",
                    name,
                    "-A",
                    "trust",
                    "-E",
                    "UTF8",
                    "--no-sync",
                    "--locale=C.UTF-8",
                ],
                preexec_fn=_as(user),
                env={**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"},
                cwd=folder,
                capture_output=True,
                text=True,
            )
            if done.returncode:
                raise NoPostgres(f"initdb failed: {done.stderr.strip() or done.stdout.strip()}")
            shutil.rmtree(template, ignore_errors=True)
            shutil.move(folder / "data", template)  # a copy across filesystems: the mark comes last
            (template / COMPLETE).touch()
        finally:
            shutil.rmtree(folder, ignore_errors=True)
    return template


@contextlib.contextmanager
def running_server() -> Iterator[PgServer]:
    """Start a server (a fraction of a second from the template), yield it, stop it and remove its folder."""
    bin_ = pg_bin()
    user = _unprivileged()
    name = user.pw_name if user is not None else pwd.getpwuid(os.geteuid()).pw_name
    template = _template(bin_, user, name)
    folder = Path(tempfile.mkdtemp(prefix="h3pg-"))
    data = folder / "data"
    if user is not None:
        os.chown(folder, user.pw_uid, user.pw_gid)
    env = {**os.environ, "LC_ALL": "C.UTF-8", "LANG": "C.UTF-8"}
    run = {"preexec_fn": _as(user), "env": env, "cwd": folder, "capture_output": True, "text": True}
    try:
        subprocess.run(["cp", "-a", template, data], check=True)  # -a: the owner and the 0700 mode stay
        for attempt in range(3):  # a port found free can be taken before the server binds it
            port = _free_port()
            settings = {
                "listen_addresses": "127.0.0.1",
                "port": port,
                "unix_socket_directories": str(folder),
                "fsync": "off",
                "synchronous_commit": "off",
                "full_page_writes": "off",
                "max_connections": 200,
                "shared_buffers": "32MB",
            }
            opts = " ".join(f"-c {k}={v}" for k, v in settings.items())
            done = subprocess.run(
                [bin_ / "pg_ctl", "-D", data, "-l", folder / "log", "-o", opts, "-w", "-t", "60", "start"], **run
            )
            if done.returncode == 0:
                break
            if attempt == 2:
                log = (folder / "log").read_text(errors="replace")[-2000:] if (folder / "log").exists() else ""
                raise NoPostgres(f"PostgreSQL did not start: {done.stderr.strip()}\n{log}")
        try:
            yield PgServer(folder, port, name, bin=bin_, runas=user, options=opts)
        finally:
            subprocess.run([bin_ / "pg_ctl", "-D", data, "-m", "immediate", "-w", "stop"], **run)
    finally:
        shutil.rmtree(folder, ignore_errors=True)
