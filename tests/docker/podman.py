"""Rootful podman as it works on a Debian machine without Docker or a registry.

Two workarounds, both private to the tests (``/etc/containers`` is left alone): a
``CONTAINERS_CONF`` that picks the ``runc`` runtime (``crun`` refuses a hybrid cgroup layout)
and sets explicit ulimits (the process may not raise its limits to podman's defaults); and a
base image made from Debian's archive with ``mmdebstrap`` (``FROM python:3.11-slim`` needs a
registry), cached under ``CUBIC_TEST_CACHE`` (default ``/var/cache/cubic-test``) keyed on
what it contains: making it costs minutes, importing it seconds.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import platform
import shutil
import subprocess
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

TOOLS = ("podman", "runc", "mmdebstrap")
SUITE = "bookworm"
PACKAGES = ("python3", "python3-venv", "ca-certificates")
"""The base's contents: Debian's python3 with venv (ensurepip), nothing else."""
DPKG_OPTIONS = (
    # no documentation, manuals or translations in an image (licences stay)
    "path-exclude=/usr/share/doc/*",
    "path-include=/usr/share/doc/*/copyright",
    "path-exclude=/usr/share/man/*",
    "path-exclude=/usr/share/info/*",
    "path-exclude=/usr/share/locale/*",
)
RECIPE = 1
"""Bump to make a new base whatever the cache holds."""
CACHE = Path(os.environ.get("CUBIC_TEST_CACHE", "/var/cache/cubic-test"))
HOST_CA = Path("/etc/ssl/certs/ca-certificates.crt")

CONTAINERS_CONF = """\
[containers]
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]

[engine]
runtime = "runc"
"""


def missing() -> str | None:
    """Why images cannot be built and run here (None: they can)."""
    absent = [t for t in TOOLS if shutil.which(t) is None]
    if absent:
        return (
            f"{', '.join(absent)} not installed "
            "(apt-get install podman buildah runc mmdebstrap docker-compose)"
        )
    if os.geteuid() != 0:
        return "not root: the tests use rootful podman (rootless needs subuid ranges)"
    return None


def environment(folder: Path) -> dict[str, str]:
    """The environment podman runs in: a private containers.conf under ``folder``."""
    conf = folder / "containers.conf"
    conf.write_text(CONTAINERS_CONF)
    return {**os.environ, "CONTAINERS_CONF": str(conf)}


def run(
    env: dict[str, str], args: Sequence[str], timeout: float, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """``podman ARGS``; a failure raises with the command's output (the test shows it)."""
    proc = subprocess.run(
        ["podman", *args], env=env, capture_output=True, text=True, timeout=timeout
    )
    if check and proc.returncode != 0:
        raise RuntimeError(
            f"podman {' '.join(args)} exited {proc.returncode}:\n"
            f"{proc.stdout[-4000:]}\n{proc.stderr[-4000:]}"
        )
    return proc


def mirror() -> str:
    """The Debian mirror apt already uses here (a machine without one: deb.debian.org)."""
    sources = Path("/etc/apt/sources.list.d/debian.sources")
    if sources.exists():
        for line in sources.read_text().splitlines():
            if line.startswith("URIs:"):
                return line.split()[1]
    listing = Path("/etc/apt/sources.list")
    if listing.exists():
        for line in listing.read_text().splitlines():
            parts = line.split()
            if len(parts) >= 3 and parts[0] == "deb" and not parts[1].startswith("["):
                return parts[1]
    return "http://deb.debian.org/debian"


def base_key() -> str:
    """What the base contains, as a short digest: its cache file's and image tag's name."""
    recipe = {
        "recipe": RECIPE,
        "suite": SUITE,
        "packages": PACKAGES,
        "dpkg": DPKG_OPTIONS,
        "mirror": mirror(),
        "arch": platform.machine(),
    }
    return hashlib.sha256(json.dumps(recipe, sort_keys=True).encode()).hexdigest()[:16]


@contextlib.contextmanager
def _locked(path: Path) -> Iterator[None]:
    """One maker of the base at a time (two test runs on one machine)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    with path.open("a") as f:
        fcntl.flock(f, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(f, fcntl.LOCK_UN)


def base_image(env: dict[str, str], timeout: float = 1500) -> str:
    """A Debian base image with Python (``BASE_IMAGE`` for docker/Dockerfile), made once:
    an image podman already holds, else the cached root file system, else mmdebstrap."""
    key = base_key()
    tag = f"localhost/cubic-test-base:{key}"
    if run(env, ["image", "exists", tag], 60, check=False).returncode == 0:
        return tag
    tarball = CACHE / f"debian-{SUITE}-python-{key}.tar.gz"
    with _locked(CACHE / "base.lock"):
        if not tarball.exists():
            partial = Path(tempfile.mkdtemp(dir=CACHE)) / tarball.name
            try:
                subprocess.run(
                    [
                        "mmdebstrap",
                        "--variant=minbase",
                        f"--include={','.join(PACKAGES)}",
                        *(f"--dpkgopt={o}" for o in DPKG_OPTIONS),
                        SUITE,
                        str(partial),
                        mirror(),
                    ],
                    check=True,
                    capture_output=True,
                    text=True,
                    timeout=timeout,
                )
                partial.rename(tarball)
            except subprocess.CalledProcessError as exc:
                raise RuntimeError(f"mmdebstrap failed:\n{exc.stderr[-4000:]}") from exc
            finally:
                shutil.rmtree(partial.parent, ignore_errors=True)
        if run(env, ["image", "exists", tag], 60, check=False).returncode != 0:
            run(env, ["import", str(tarball), tag], 600)
    return tag


def trusting_base(env: dict[str, str], base: str, folder: Path) -> str:
    """``base`` plus this host's CA bundle, named in a pip.conf: HTTPS from a build here may
    pass a proxy whose certificate only the host's bundle carries. A layer of its own, so
    the cached base does not depend on the host's certificates."""
    digest = hashlib.sha256(HOST_CA.read_bytes()).hexdigest()[:12] if HOST_CA.exists() else "none"
    tag = f"{base}-ca-{digest}"
    if run(env, ["image", "exists", tag], 60, check=False).returncode == 0:
        return tag
    context = folder / "trusting-base"
    context.mkdir(parents=True, exist_ok=True)
    lines = [f"FROM {base}"]
    if HOST_CA.exists():
        shutil.copy(HOST_CA, context / "host-ca.crt")
        (context / "pip.conf").write_text("[global]\ncert = /etc/ssl/certs/host-ca.crt\n")
        lines += ["COPY host-ca.crt /etc/ssl/certs/host-ca.crt", "COPY pip.conf /etc/pip.conf"]
    (context / "Containerfile").write_text("\n".join(lines) + "\n")
    run(env, ["build", "--format", "docker", "-t", tag, str(context)], 600)
    return tag
