"""A PostgreSQL cluster of its own (initdb on a free port), for benchmarks and fault tests.

The server a user gives is left alone: a benchmark that needs more connections than it
allows, or a test that kills the database, starts one of these instead. Needs the server
binaries (``initdb``, ``pg_ctl``) and, as root, the ``postgres`` user.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

from cubic.bench.service import free_port

PG_BIN = next(iter(sorted(Path("/usr/lib/postgresql").glob("*/bin"), reverse=True)), None)


def can_run_postgres() -> str | None:
    """Why a PostgreSQL cluster of the test's own cannot start here (None: it can)."""
    if PG_BIN is None or not (PG_BIN / "initdb").exists():
        return "PostgreSQL server binaries (initdb, pg_ctl) not found"
    if os.geteuid() != 0 and shutil.which("runuser") is None:
        return "not root: cannot start a PostgreSQL cluster as the postgres user"
    try:
        import pwd

        pwd.getpwnam("postgres")
    except KeyError:
        return "no postgres user"
    return None


class PgCluster:
    """A PostgreSQL cluster of its own (initdb, another port), started and stopped at will:
    the given server is left alone."""

    def __init__(self, *, max_connections: int = 100, fsync: bool = False) -> None:
        """``fsync=False`` (tests): faster and still crash-consistent for what they check."""
        if PG_BIN is None:
            raise RuntimeError(can_run_postgres() or "PostgreSQL server binaries not found")
        self.max_connections = max_connections
        self.fsync = fsync
        # Not under pytest's tmp_path: its folders are private to root, and the server runs
        # as the postgres user.
        self.folder = Path(tempfile.mkdtemp(prefix="cubic-pg-"))
        self.folder.chmod(0o755)
        if os.geteuid() == 0:
            shutil.chown(self.folder, "postgres", "postgres")
        self.data = self.folder / "pgdata"
        self.port = free_port()
        self._as_postgres(
            [str(PG_BIN / "initdb"), "-D", str(self.data), "-A", "trust", "-U", "postgres", "-N"]
        )
        self.url = f"postgresql+psycopg://postgres@127.0.0.1:{self.port}/postgres"

    def remove(self) -> None:
        if self.running():
            self.stop()
        shutil.rmtree(self.folder, ignore_errors=True)

    def _as_postgres(self, cmd: list[str]) -> None:
        if os.geteuid() == 0:
            cmd = ["runuser", "-u", "postgres", "--", *cmd]
        subprocess.run(cmd, check=True, capture_output=True, timeout=120)

    def start(self) -> None:
        opts = (
            f"-p {self.port} -c listen_addresses=127.0.0.1 -k {self.folder} "
            f"-c max_connections={self.max_connections} -c fsync={'on' if self.fsync else 'off'}"
        )
        self._as_postgres(
            [
                *(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-o", opts),
                *("-l", str(self.folder / "pg.log"), "-w", "-t", "60", "start"),
            ]
        )

    def stop(self, mode: str = "immediate") -> None:
        """``immediate``: every connection drops at once, as when the database host dies."""
        self._as_postgres(
            [str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "60", "stop"]
        )

    def running(self) -> bool:
        return (self.data / "postmaster.pid").exists()
