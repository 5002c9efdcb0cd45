"""A real single-node Slurm cluster for the tests: munged, slurmctld and slurmd on this host.

The configuration, state, spool and logs live in a temporary folder and ``SLURM_CONF``
points at it for the whole session, so the cluster needs nothing under ``/etc/slurm`` and
the runner's ``sbatch``/``squeue``/``scontrol`` find it through the environment they
inherit. Accounting (``slurmdbd``) is not started: finished jobs are read back through
``scontrol show job`` for ``MinJobAge`` seconds, the runner's fallback when ``sacct`` is
unavailable.

Run ``python -m tests.runners.slurm_cluster`` to start one by hand (Ctrl-C stops it).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.requirements import need

BINARIES = ("munged", "slurmctld", "slurmd", "sbatch", "squeue", "scontrol", "sinfo", "scancel")
MUNGE_SOCKET = Path("/run/munge/munge.socket.2")
MIN_JOB_AGE_S = 600  # finished jobs stay visible to ``scontrol show job`` this long


def missing() -> str | None:
    """Why a cluster cannot be started here, or None."""
    if os.geteuid() != 0:
        return "starting slurmctld/slurmd/munged needs root"
    absent = [b for b in BINARIES if shutil.which(b) is None]
    if absent:
        return f"not installed: {', '.join(absent)} (apt-get install slurm-wlm munge)"
    if not Path("/etc/munge/munge.key").is_file() and not MUNGE_SOCKET.exists():
        return "no /etc/munge/munge.key"
    return None


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _mem_mb() -> int:
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            return int(line.split()[1]) // 1024
    return 1024


def slurm_conf(folder: Path, host: str, cpus: int) -> str:
    ctld_port, slurmd_port = _free_port(), _free_port()
    return f"""\
ClusterName=cubic-test
SlurmctldHost={host}(127.0.0.1)
SlurmctldPort={ctld_port}
SlurmdPort={slurmd_port}
AuthType=auth/munge
CredType=cred/munge
MpiDefault=none
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SchedulerType=sched/backfill
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
SlurmUser=root
SlurmdUser=root
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
ReturnToService=2
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
JobCompType=jobcomp/filetxt
JobCompLoc={folder}/jobcomp.txt
MinJobAge={MIN_JOB_AGE_S}
SlurmctldTimeout=10
SlurmdTimeout=30
MessageTimeout=10
KillWait=2
OverTimeLimit=0
InactiveLimit=0
NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} RealMemory={int(_mem_mb() * 0.8)} State=UNKNOWN
PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP
"""


class SlurmCluster:
    """Starts and stops the daemons; ``env`` is what a client needs (``SLURM_CONF``)."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.conf = folder / "slurm.conf"
        self.host = socket.gethostname().split(".")[0]
        self.procs: list[subprocess.Popen[bytes]] = []
        self.munged: subprocess.Popen[bytes] | None = None

    @property
    def env(self) -> dict[str, str]:
        return {**os.environ, "SLURM_CONF": str(self.conf)}

    def start(self, timeout_s: float = 60.0) -> None:
        for sub in ("state", "spool"):
            (self.folder / sub).mkdir(parents=True, exist_ok=True)
        self.conf.write_text(slurm_conf(self.folder, self.host, os.cpu_count() or 1))
        self._start_munge()
        for daemon in ("slurmctld", "slurmd"):
            log = (self.folder / f"{daemon}.out").open("wb")
            self.procs.append(
                subprocess.Popen(
                    [daemon, "-D", "-f", str(self.conf)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    env=self.env,
                    start_new_session=True,
                )
            )
            log.close()
        self._wait_idle(timeout_s)

    def _start_munge(self) -> None:
        if self._munge_works():
            return  # a munged of the host's own is already serving
        run_dir = MUNGE_SOCKET.parent
        run_dir.mkdir(parents=True, exist_ok=True)
        shutil.chown(run_dir, "munge", "munge")
        # In the foreground, as our child: stopped and reaped by us, not left to init.
        with (self.folder / "munged.out").open("wb") as log:
            self.munged = subprocess.Popen(
                ["munged", "--force", "--foreground"],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        deadline = time.monotonic() + 15
        while not self._munge_works():
            if self.munged.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"munged did not start:\n{self.logs()}")
            time.sleep(0.2)

    @staticmethod
    def _munge_works() -> bool:
        if not MUNGE_SOCKET.exists():
            return False
        token = subprocess.run(["munge", "-n"], capture_output=True, timeout=10)
        if token.returncode != 0:
            return False
        check = subprocess.run(["unmunge"], input=token.stdout, capture_output=True, timeout=10)
        return check.returncode == 0

    def _wait_idle(self, timeout_s: float) -> None:
        deadline = time.monotonic() + timeout_s
        out = ""
        while time.monotonic() < deadline:
            for p in self.procs:
                if p.poll() is not None:
                    raise RuntimeError(f"{p.args[0]} exited with {p.returncode}:\n{self.logs()}")
            res = subprocess.run(
                ["sinfo", "--noheader", "--format=%t"],
                capture_output=True,
                text=True,
                env=self.env,
                timeout=30,
            )
            out = (res.stdout + res.stderr).strip()
            if res.returncode == 0 and out == "idle":
                return
            time.sleep(0.5)
        raise RuntimeError(f"the node did not become idle (sinfo: {out!r}):\n{self.logs()}")

    def logs(self, chars: int = 4000) -> str:
        parts = []
        for name in ("slurmctld.log", "slurmd.log", "slurmctld.out", "slurmd.out", "munged.out"):
            path = self.folder / name
            if path.is_file():
                parts.append(f"--- {name}\n{path.read_text(errors='replace')[-chars:]}")
        return "\n".join(parts)

    def stop(self) -> None:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            subprocess.run(["scontrol", "shutdown"], env=self.env, capture_output=True, timeout=15)
        for p in reversed(self.procs):
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait(timeout=10)
        self.procs.clear()
        if self.munged is not None:
            self.munged.terminate()
            try:
                self.munged.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.munged.kill()
                self.munged.wait(timeout=10)
            self.munged = None


@contextlib.contextmanager
def running_cluster(folder: Path) -> Iterator[SlurmCluster]:
    """A started cluster with ``SLURM_CONF`` set in this process; both undone on exit."""
    cluster = SlurmCluster(folder)
    before = os.environ.get("SLURM_CONF")
    try:
        cluster.start()
        os.environ["SLURM_CONF"] = str(cluster.conf)
        yield cluster
    finally:
        if before is None:
            os.environ.pop("SLURM_CONF", None)
        else:
            os.environ["SLURM_CONF"] = before
        cluster.stop()


@pytest.fixture(scope="session")
def slurm_cluster() -> Iterator[SlurmCluster]:
    """A real single-node Slurm cluster for the session (skipped where it cannot start)."""
    why = missing()
    need("slurm", why is None, why or "")
    folder = Path(tempfile.mkdtemp(prefix="cubic-slurm-"))
    try:
        with running_cluster(folder) as cluster:
            yield cluster
    finally:
        shutil.rmtree(folder, ignore_errors=True)


if __name__ == "__main__":
    why = missing()
    if why:
        raise SystemExit(why)
    import signal

    def _interrupt(*_: object) -> None:
        raise KeyboardInterrupt

    signal.signal(signal.SIGTERM, _interrupt)  # stop the daemons on SIGTERM too
    with running_cluster(Path(tempfile.mkdtemp(prefix="cubic-slurm-"))) as c:
        print(f"export SLURM_CONF={c.conf}", flush=True)
        with contextlib.suppress(KeyboardInterrupt):
            while True:
                time.sleep(3600)
