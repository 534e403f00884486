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
            connection.execute(f'CREATE DATABASE "{name}"')  # type: ignore[arg-type]
        return self.url(name)

    def _command(self, *args: str) -> list[str]:
        # initdb and the server refuse to run as root: as the package's `postgres` user then.
        command = [str(self.bin_dir / args[0]), *args[1:]]
        return ["runuser", "-u", self.run_as, "--", *command] if self.run_as else command

    def start(self) -> None:
        subprocess.run(
            self._command("initdb", "-D", str(self.data_dir), "-U", _USER, "-A", "trust", "-E", "UTF8"),
            check=True,
            capture_output=True,
        )
        # The socket in /tmp: a long data folder path would pass the socket path's length limit.
        options = f"-p {self.port} -k /tmp -c listen_addresses=127.0.0.1 -c fsync=off"
        subprocess.run(
            self._command(
                "pg_ctl",
                "-D",
                str(self.data_dir),
                "-o",
                options,
                "-l",
                str(self.data_dir.parent / "log"),
                "-w",
                "start",
            ),
            check=True,
            capture_output=True,
        )

    def stop(self) -> None:
        subprocess.run(
            self._command("pg_ctl", "-D", str(self.data_dir), "-m", "immediate", "-w", "stop"),
            check=False,
            capture_output=True,
        )


@pytest.fixture(scope="session")
def postgres_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PostgresServer]:
    bin_dir = postgres_bin_dir()
    if bin_dir is None:
        pytest.skip(
            "PostgreSQL binaries (initdb, pg_ctl) not found: install Debian's `postgresql` package "
            "(scripts/install-system-deps.sh does; CI always runs these tests)"
        )
    run_as = None
    folder = tmp_path_factory.mktemp("postgres")
    if os.geteuid() == 0:
        run_as = "postgres"
        try:
            account = pwd.getpwnam(run_as)
        except KeyError:
            pytest.skip("running as root and there is no `postgres` user to run the server as")
        os.chmod(folder, 0o755)
        for parent in folder.parents:
            # The server's user must reach its data folder through the temp folders.
            if parent == Path(parent.anchor):
                break
            os.chmod(parent, os.stat(parent).st_mode | 0o011)
        os.chown(folder, account.pw_uid, account.pw_gid)
    server = PostgresServer(bin_dir, folder / "data", _free_port(), run_as)
    if run_as is not None:
        server.data_dir.mkdir()
        os.chown(server.data_dir, account.pw_uid, account.pw_gid)
    server.start()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """A new database on the session's server."""
    return postgres_server.new_database()
