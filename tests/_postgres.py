"""A real PostgreSQL server for the tests: Debian's `postgresql` binaries (initdb, pg_ctl) on a
temporary data folder and a free loopback port, once per session; a fresh database per test.

`scripts/install-system-deps.sh` installs the package (CI runs it), so there these tests always
run; on a machine without the binaries they skip, saying so.
"""

from __future__ import annotations

import itertools
import os
import pwd
import shutil
import socket
import subprocess
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

__all__ = ["PostgresServer", "postgres_bin_dir", "postgres_server", "postgres_url"]

_USER = "vlmserve"


def postgres_bin_dir() -> Path | None:
    """Where initdb and pg_ctl are: the newest /usr/lib/postgresql/N/bin, else on PATH."""
    versions = (
        sorted(
            Path("/usr/lib/postgresql").glob("*/bin"), key=lambda path: int(path.parent.name), reverse=True
        )
        if Path("/usr/lib/postgresql").is_dir()
        else []
    )
    for candidate in versions:
        if (candidate / "initdb").exists() and (candidate / "pg_ctl").exists():
            return candidate
    initdb = shutil.which("initdb")
    if initdb is not None and shutil.which("pg_ctl") is not None:
        return Path(initdb).parent
    return None


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port: int = sock.getsockname()[1]
        return port


@dataclass
class PostgresServer:
    bin_dir: Path
    data_dir: Path
    port: int
    run_as: str | None
    _names: Iterator[int] = field(default_factory=itertools.count)

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://{_USER}@127.0.0.1:{self.port}/{database}"

    def new_database(self) -> str:
        """The URL of a new, empty database."""
        import psycopg

        name = f"test_{os.getpid()}_{next(self._names)}"
        with psycopg.connect(self.url(), autocommit=True) as connection:
            connection.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)

    def _command(self, *args: str) -> list[str]:
        command = [str(self.bin_dir / args[0]), *args[1:]]
        return ["runuser", "-u", self.run_as, "--", *command] if self.run_as else command

    def _run(self, *args: str) -> None:
        done = subprocess.run(self._command(*args), capture_output=True, text=True, check=False)
        if done.returncode != 0:
            raise RuntimeError(f"{args[0]} failed ({done.returncode}): {done.stderr or done.stdout}")

    def start(self) -> None:
        # --no-sync: the data is thrown away with the session (fsync is off below too).
        self._run("initdb", "--no-sync", "-D", str(self.data_dir), "-U", _USER, "-A", "trust", "-E", "UTF8")
        # The socket in /tmp: a long data folder path would pass the socket path's length limit.
        options = f"-p {self.port} -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off"
        log = str(self.data_dir.parent / "log")
        self._run("pg_ctl", "-D", str(self.data_dir), "-o", options, "-l", log, "-w", "start")

    def stop(self) -> None:
        subprocess.run(
            self._command("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"),
            check=False,
            capture_output=True,
        )


def _memory_folder() -> str | None:
    """/dev/shm where there is one: a database per test is ~1000 files, and on a busy disk
    initdb, the databases and removing them all at the end took ~40 s a session (2 s here)."""
    shm = Path("/dev/shm")
    return str(shm) if shm.is_dir() and os.access(shm, os.W_OK | os.X_OK) else None


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        if os.environ.get("CI"):
            pytest.fail("CI runs the PostgreSQL tests: scripts/install-system-deps.sh installs `postgresql`")
        pytest.skip(
            "PostgreSQL binaries (initdb, pg_ctl) not found: install Debian's `postgresql` package "
            "(scripts/install-system-deps.sh does; CI always runs these tests)"
        )
    run_as = None
    # Not under pytest's temp folder: pytest makes its root 0700 again at each session start,
    # which would lock the server's user (below) out of its own data folder.
    folder = Path(tempfile.mkdtemp(prefix="vlmserve-postgres-", dir=_memory_folder()))
    try:
        if os.geteuid() == 0:
            # initdb and the server refuse to run as root: as the package's `postgres` user then.
            run_as = "postgres"
            try:
                account = pwd.getpwnam(run_as)
            except KeyError:
                pytest.skip("running as root and there is no `postgres` user to run the server as")
            os.chown(folder, account.pw_uid, account.pw_gid)
        server = PostgresServer(bin_dir, folder / "data", _free_port(), run_as)
        server.start()
        try:
            yield server
        finally:
            server.stop()
    finally:
        shutil.rmtree(folder, ignore_errors=True)


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A new database on the session's server."""
    return postgres_server.new_database()
